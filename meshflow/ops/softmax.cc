#include "meshflow/ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/softmax.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow {

bool is_softmax_family(OpType t) {
  return t == OpType::kSoftmax || t == OpType::kSoftmaxGrad || t == OpType::kSoftmaxCrossEntropy ||
         t == OpType::kSoftmaxCrossEntropyGrad || t == OpType::kMse || t == OpType::kMseGrad;
}

namespace {

void check_same(std::string_view name, const TensorSpec& a, const TensorSpec& b) {
  if (a.shape != b.shape || a.dtype != b.dtype) {
    fail(ErrorKind::kShapeMismatch, "{}: operands {} {} and {} {} differ", name, to_string(a.shape),
         to_string(a.dtype), to_string(b.shape), to_string(b.dtype));
  }
}

void check_scalar(std::string_view name, const TensorSpec& g, const TensorSpec& like) {
  if (!g.shape.empty() || g.dtype != like.dtype) {
    fail(ErrorKind::kShapeMismatch, "{}: the loss gradient must be a {} scalar, got {} {}", name,
         to_string(like.dtype), to_string(g.shape), to_string(g.dtype));
  }
}

// Splits `shape` around `dim`: outer (before), d (the dim), inner (after).
struct Around {
  std::int64_t outer = 1, d = 1, inner = 1;
};
Around around(const Shape& shape, int dim) {
  Around a;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (i < dim) a.outer *= shape[i];
    if (i == dim) a.d = shape[i];
    if (i > dim) a.inner *= shape[i];
  }
  return a;
}

// y = softmax(x) along the middle axis of [outer, d, inner]; rows (inner 1) of float32 through
// the vector loops, one pass for the max and one for the exponentials and their sum.
template <typename T>
void softmax_rows(const T* x, T* y, Around a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.inner == 1) {
      parallel_for(a.outer, row_grain(a.d), [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t o = first; o < last; ++o)
          softmax_row(x + o * a.d, y + o * a.d, a.d, a.d, 1.0f);
      });
      return;
    }
  }
  for (std::int64_t o = 0; o < a.outer; ++o) {
    for (std::int64_t i = 0; i < a.inner; ++i) {
      const T* xs = x + o * a.d * a.inner + i;
      T* ys = y + o * a.d * a.inner + i;
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = 0; j < a.d; ++j) mx = std::max(mx, xs[j * a.inner]);
      T sum = 0;
      for (std::int64_t j = 0; j < a.d; ++j) {
        const T e = std::exp(xs[j * a.inner] - mx);
        ys[j * a.inner] = e;
        sum += e;
      }
      for (std::int64_t j = 0; j < a.d; ++j) ys[j * a.inner] /= sum;
    }
  }
}

// Returns log Σ exp(x) over a row of n logits (its max subtracted first).
template <typename T>
T log_sum_exp(const T* x, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return log_sum_exp_row(x, n);
  } else {
    const T mx = *std::max_element(x, x + n);
    T sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += std::exp(x[j] - mx);
    return std::log(sum) + mx;
  }
}

template <typename T>
Tensor run(const Op& op, const std::vector<const Tensor*>& in,
           const std::vector<TensorSpec>& globals) {
  const Tensor& x = *in[0];
  const T* px = reinterpret_cast<const T*>(x.bytes());
  switch (op.type) {
    case OpType::kSoftmax: {
      Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
      softmax_rows(px, reinterpret_cast<T*>(y.bytes()), around(x.shape(), op.dim));
      return y;
    }
    case OpType::kSoftmaxGrad: {  // (g, y): y * (g - Σ g*y)
      const Tensor& yt = *in[1];
      const T* py = reinterpret_cast<const T*>(yt.bytes());
      Tensor out = Tensor::uninitialized(x.dtype(), x.shape());
      T* po = reinterpret_cast<T*>(out.bytes());
      const Around a = around(x.shape(), op.dim);
      for (std::int64_t o = 0; o < a.outer; ++o) {
        for (std::int64_t i = 0; i < a.inner; ++i) {
          const std::int64_t base = o * a.d * a.inner + i;
          T dot = 0;
          for (std::int64_t j = 0; j < a.d; ++j)
            dot += px[base + j * a.inner] * py[base + j * a.inner];
          for (std::int64_t j = 0; j < a.d; ++j) {
            const std::int64_t k = base + j * a.inner;
            po[k] = py[k] * (px[k] - dot);
          }
        }
      }
      return out;
    }
    case OpType::kSoftmaxCrossEntropy:
    case OpType::kSoftmaxCrossEntropyGrad: {
      const std::int64_t rows = x.shape()[0], classes = x.shape()[1];
      const auto batch = static_cast<T>(globals[0].shape[0]);
      if (op.type == OpType::kSoftmaxCrossEntropy) {
        // -log softmax[label], from the logits directly (no log of a rounded-to-0 probability)
        // Rows split over the device's threads, each part's sum added in part order.
        Tensor loss(x.dtype(), {});
        const int parts = parallel_parts(rows, row_grain(classes));
        std::vector<T> partial(static_cast<std::size_t>(parts), T(0));
        parallel_parts_for(rows, parts, [&](int part, std::int64_t first, std::int64_t last) {
          T sum = 0;
          for (std::int64_t r = first; r < last; ++r) {
            const T* xr = px + r * classes;
            sum += log_sum_exp(xr, classes) - xr[class_label(*in[1], r, classes)];
          }
          partial[static_cast<std::size_t>(part)] = sum;
        });
        T total = 0;
        for (T v : partial) total += v;
        reinterpret_cast<T*>(loss.bytes())[0] = total / batch;
        return loss;
      }
      // g (softmax(x) - onehot(label)) / batch, row by row: the max, the exponentials and
      // their sum, then one scaling by g / sum (the row is in cache after the first pass).
      Tensor p = Tensor::uninitialized(x.dtype(), x.shape());
      T* pp = reinterpret_cast<T*>(p.bytes());
      const T g = reinterpret_cast<const T*>(in[2]->bytes())[0] / batch;
      parallel_for(rows, row_grain(classes), [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t r = first; r < last; ++r) {
          const T* xr = px + r * classes;
          T* pr = pp + r * classes;
          const std::int64_t label = class_label(*in[1], r, classes);
          if constexpr (std::is_same_v<T, float>) {
            cross_entropy_grad_row(xr, classes, label, g, pr);
          } else {
            const T mx = *std::max_element(xr, xr + classes);
            T sum = 0;
            for (std::int64_t j = 0; j < classes; ++j) sum += pr[j] = std::exp(xr[j] - mx);
            const T scale = g / sum;
            for (std::int64_t j = 0; j < classes; ++j) pr[j] *= scale;
            pr[label] -= g;
          }
        }
      });
      return p;
    }
    case OpType::kMse: {
      const T* pb = reinterpret_cast<const T*>(in[1]->bytes());
      T total = 0;
      for (std::int64_t i = 0; i < x.numel(); ++i) total += (px[i] - pb[i]) * (px[i] - pb[i]);
      Tensor loss(x.dtype(), {});
      reinterpret_cast<T*>(loss.bytes())[0] = total / static_cast<T>(numel(globals[0].shape));
      return loss;
    }
    case OpType::kMseGrad: {
      const T* pb = reinterpret_cast<const T*>(in[1]->bytes());
      const T g = reinterpret_cast<const T*>(in[2]->bytes())[0] * T(2) /
                  static_cast<T>(numel(globals[0].shape));
      Tensor out = Tensor::uninitialized(x.dtype(), x.shape());
      T* po = reinterpret_cast<T*>(out.bytes());
      for (std::int64_t i = 0; i < x.numel(); ++i) po[i] = g * (px[i] - pb[i]);
      return out;
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a softmax or loss operator", to_string(op.type));
  }
}

}  // namespace

std::int64_t class_label(const Tensor& labels, std::int64_t row, std::int64_t classes) {
  const auto r = static_cast<std::size_t>(row);
  const std::int64_t l = labels.dtype() == DType::kInt32 ? labels.data<std::int32_t>()[r]
                                                         : labels.data<std::int64_t>()[r];
  if (l < 0 || l >= classes) {
    fail(ErrorKind::kInvalidArgument,
         "softmax_cross_entropy: label {} (row {} of this shard) is outside [0, {})", l, row,
         classes);
  }
  return l;
}

TensorSpec infer_softmax(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, std::span(in).first(1), /*floating_only=*/true);
  switch (op.type) {
    case OpType::kSoftmax:
      return in[0];
    case OpType::kSoftmaxGrad:
      check_same(name, in[0], in[1]);
      return in[0];
    case OpType::kSoftmaxCrossEntropy:
    case OpType::kSoftmaxCrossEntropyGrad: {
      const TensorSpec& logits = in[0];
      const TensorSpec& labels = in[1];
      if (labels.dtype != DType::kInt32 && labels.dtype != DType::kInt64) {
        fail(ErrorKind::kInvalidArgument, "{}: labels are {}; they must be int32 or int64", name,
             to_string(labels.dtype));
      }
      if (logits.shape.size() != 2 || labels.shape != Shape{logits.shape[0]}) {
        fail(ErrorKind::kShapeMismatch, "{}: logits {} and labels {} do not fit [B, C] and [B]",
             name, to_string(logits.shape), to_string(labels.shape));
      }
      if (op.type == OpType::kSoftmaxCrossEntropy) return {{}, logits.dtype};
      check_scalar(name, in[2], logits);
      return logits;
    }
    case OpType::kMse:
      check_same(name, in[0], in[1]);
      return {{}, in[0].dtype};
    case OpType::kMseGrad:
      check_same(name, in[0], in[1]);
      check_scalar(name, in[2], in[0]);
      return in[0];
    default:
      MESHFLOW_CHECK(false, "{} is not a softmax or loss operator", name);
  }
}

Tensor softmax_kernel(const Op& op, const std::vector<const Tensor*>& in,
                      const std::vector<TensorSpec>& globals) {
  return visit_dtype(in[0]->dtype(), [&](auto zero) -> Tensor {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      return run<T>(op, in, globals);
    } else {
      MESHFLOW_CHECK(false, "integer {}", to_string(op.type));
    }
  });
}

DimLabels softmax_labels(const Op& op, const std::vector<TensorSpec>& in, const Shape& out) {
  DimLabels l;
  const int r = static_cast<int>(out.size());
  switch (op.type) {
    case OpType::kSoftmax:
    case OpType::kSoftmaxGrad:
      l.inputs.assign(in.size(), label_range(0, r));
      l.output = label_range(0, r);
      l.unshardable = {op.dim};
      if (op.type == OpType::kSoftmaxGrad) l.factors = {0};
      return l;
    case OpType::kSoftmaxCrossEntropy:
    case OpType::kSoftmaxCrossEntropyGrad:
      l.inputs = {{0, 1}, {0}};
      l.statistics = {1};  // a class shard runs vocabulary-parallel (ops/vocab_parallel.h)
      if (op.type == OpType::kSoftmaxCrossEntropyGrad) {
        l.inputs.push_back({});
        l.output = {0, 1};
        l.factors = {2};
      }
      return l;
    case OpType::kMse:
    case OpType::kMseGrad: {
      const int ra = static_cast<int>(in[0].shape.size());
      l.inputs = {label_range(0, ra), label_range(0, ra)};
      if (op.type == OpType::kMseGrad) {
        l.inputs.push_back({});
        l.output = label_range(0, ra);
        l.factors = {2};
      }
      return l;
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a softmax or loss operator", to_string(op.type));
  }
}

}  // namespace meshflow
