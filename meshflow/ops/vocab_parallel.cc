#include "meshflow/ops/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/softmax.h"
#include "meshflow/kernels/vector_math.h"
#include "meshflow/ops/softmax.h"

namespace meshflow {

bool is_vocab_parallel_family(OpType t) {
  return t == OpType::kLogitMax || t == OpType::kLogitStats ||
         t == OpType::kCrossEntropyFromStats || t == OpType::kCrossEntropyGradFromStats;
}

namespace {

void expect(bool ok, const Op& op, std::string_view what, const TensorSpec& got) {
  if (!ok) {
    fail(ErrorKind::kShapeMismatch, "{}: {} is {} {}", to_string(op.type), what,
         to_string(got.shape), to_string(got.dtype));
  }
}

bool is_index(DType d) { return d == DType::kInt32 || d == DType::kInt64; }

template <typename T>
Tensor run(const Op& op, const std::vector<const Tensor*>& in,
           const std::vector<TensorSpec>& globals, std::int64_t first_class) {
  const Tensor& lead = *in[0];
  const std::int64_t rows = lead.shape()[0];
  const std::int64_t cols = lead.shape().size() == 2 ? lead.shape()[1] : 0;
  const T* x = lead.data<T>().data();
  switch (op.type) {
    case OpType::kLogitMax: {
      Tensor out = Tensor::uninitialized(lead.dtype(), {rows});
      T* m = out.data<T>().data();
      parallel_for(rows, row_grain(cols), [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t r = first; r < last; ++r) {
          // a shard without classes contributes the identity of max
          if constexpr (std::is_same_v<T, float>) {
            m[r] = vector_math().max(x + r * cols, cols);
          } else {
            m[r] = cols ? *std::max_element(x + r * cols, x + (r + 1) * cols)
                        : -std::numeric_limits<T>::infinity();
          }
        }
      });
      return out;
    }
    case OpType::kLogitStats: {
      const T* m = in[1]->data<T>().data();
      const std::int64_t classes = globals[0].shape[1];
      Tensor out = Tensor::uninitialized(lead.dtype(), {rows, 2});
      T* st = out.data<T>().data();
      parallel_for(rows, row_grain(cols), [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t r = first; r < last; ++r) {
          const T* xr = x + r * cols;
          T sum = 0;
          if constexpr (std::is_same_v<T, float>) {
            sum = vector_math().sum_exp(xr, m[r], cols);
          } else {
            for (std::int64_t j = 0; j < cols; ++j) sum += std::exp(xr[j] - m[r]);
          }
          const std::int64_t local = class_label(*in[2], r, classes) - first_class;
          st[2 * r] = sum;
          st[2 * r + 1] = local >= 0 && local < cols ? xr[local] : T(0);
        }
      });
      return out;
    }
    case OpType::kCrossEntropyFromStats: {
      const T* m = x;
      const T* st = in[1]->data<T>().data();
      T total = 0;
      for (std::int64_t r = 0; r < rows; ++r) total += m[r] + std::log(st[2 * r]) - st[2 * r + 1];
      Tensor loss(lead.dtype(), {});
      loss.data<T>()[0] = total / static_cast<T>(globals[0].shape[0]);
      return loss;
    }
    case OpType::kCrossEntropyGradFromStats: {
      const T* m = in[2]->data<T>().data();
      const T* st = in[3]->data<T>().data();
      const std::int64_t classes = globals[0].shape[1];
      const T scale = in[4]->data<T>()[0] / static_cast<T>(globals[0].shape[0]);
      Tensor out = Tensor::uninitialized(lead.dtype(), lead.shape());
      T* g = out.data<T>().data();
      parallel_for(rows, row_grain(cols), [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t r = first; r < last; ++r) {
          const T* xr = x + r * cols;
          T* gr = g + r * cols;
          const T over = scale / st[2 * r];
          if constexpr (std::is_same_v<T, float>) {
            scaled_exp_row(xr, cols, m[r], over, gr);
          } else {
            for (std::int64_t j = 0; j < cols; ++j) gr[j] = over * std::exp(xr[j] - m[r]);
          }
          const std::int64_t local = class_label(*in[1], r, classes) - first_class;
          if (local >= 0 && local < cols) gr[local] -= scale;
        }
      });
      return out;
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a vocabulary-parallel step", to_string(op.type));
  }
}

}  // namespace

TensorSpec infer_vocab_parallel(const Op& op, const std::vector<TensorSpec>& in) {
  check_operand_dtypes(op.type, std::span(in).first(1), /*floating_only=*/true);
  const TensorSpec& lead = in[0];  // the logits, or cross_entropy_from_stats' max
  const bool from_stats = op.type == OpType::kCrossEntropyFromStats;
  expect(lead.shape.size() == (from_stats ? 1u : 2u), op, from_stats ? "the max" : "the logits",
         lead);
  const std::int64_t rows = lead.shape[0];
  auto row_max = [&](std::size_t i) {
    expect(in[i].shape == Shape{rows} && in[i].dtype == lead.dtype, op, "the max", in[i]);
  };
  auto stats = [&](std::size_t i) {
    expect(in[i].shape == Shape{rows, 2} && in[i].dtype == lead.dtype, op, "the statistics", in[i]);
  };
  auto labels = [&](std::size_t i) {
    expect(in[i].shape == Shape{rows} && is_index(in[i].dtype), op, "the labels", in[i]);
  };
  switch (op.type) {
    case OpType::kLogitMax:
      return {{rows}, lead.dtype};
    case OpType::kLogitStats:
      row_max(1);
      labels(2);
      return {{rows, 2}, lead.dtype};
    case OpType::kCrossEntropyFromStats:
      stats(1);
      return {{}, lead.dtype};
    case OpType::kCrossEntropyGradFromStats:
      labels(1);
      row_max(2);
      stats(3);
      expect(in[4].shape.empty() && in[4].dtype == lead.dtype, op, "the loss gradient", in[4]);
      return lead;
    default:
      MESHFLOW_CHECK(false, "{} is not a vocabulary-parallel step", to_string(op.type));
  }
}

Tensor vocab_parallel_kernel(const Op& op, const std::vector<const Tensor*>& in,
                             const std::vector<TensorSpec>& globals, const ShardOffsets& offsets) {
  const bool reads_classes =
      op.type == OpType::kLogitStats || op.type == OpType::kCrossEntropyGradFromStats;
  const std::int64_t first_class = reads_classes && !offsets.empty() ? offsets[0][1] : 0;
  if (in[0]->dtype() == DType::kFloat64) return run<double>(op, in, globals, first_class);
  return run<float>(op, in, globals, first_class);
}

DimLabels vocab_parallel_labels(const Op& op, const std::vector<TensorSpec>&) {
  constexpr int kRow = 0, kClass = 1, kPair = 2;  // a statistics row's (sum, picked) pair
  DimLabels l;
  switch (op.type) {
    case OpType::kLogitMax:
      l.inputs = {{kRow, kClass}};
      l.output = {kRow};
      l.reduce = ReduceOp::kMax;  // a class shard's row maxima: P(max)
      break;
    case OpType::kLogitStats:
      l.inputs = {{kRow, kClass}, {kRow}, {kRow}};
      l.output = {kRow, kPair};  // a class shard's sums and picked logits: P(sum)
      break;
    case OpType::kCrossEntropyFromStats:
      l.inputs = {{kRow}, {kRow, kPair}};
      l.unshardable = {kPair};
      break;
    case OpType::kCrossEntropyGradFromStats:
      l.inputs = {{kRow, kClass}, {kRow}, {kRow}, {kRow, kPair}, {}};
      l.output = {kRow, kClass};
      l.unshardable = {kPair};
      l.factors = {4};  // linear in the loss gradient
      break;
    default:
      MESHFLOW_CHECK(false, "{} is not a vocabulary-parallel step", to_string(op.type));
  }
  return l;
}

bool needs_lowering(const Op& op, const std::vector<Layout>& layouts) {
  if (op.type != OpType::kSoftmaxCrossEntropy && op.type != OpType::kSoftmaxCrossEntropyGrad)
    return false;
  // A class shard over a mesh dim of one device is the whole dim: the kernel runs as it is.
  const Layout& logits = layouts[0];
  for (std::size_t m = 0; m < logits.placements.size(); ++m) {
    const Placement& p = logits.placements[m];
    if (p.is_shard() && p.dim == 1 && logits.mesh.shape[m] > 1) return true;
  }
  return false;
}

Lowering lower(const Op& op, const std::vector<Layout>& layouts, const PlanOptions& options) {
  MESHFLOW_CHECK(needs_lowering(op, layouts), "{} does not shard its classes", to_string(op));
  const Layout& logits = layouts[0];
  // The statistics keep the logits' row shard and are whole over every other mesh dim.
  std::vector<Placement> rows(logits.placements.size(), Placement::replicate());
  for (std::size_t m = 0; m < rows.size(); ++m)
    if (logits.placements[m].is_shard() && logits.placements[m].dim == 0)
      rows[m] = Placement::shard(0);
  Lowering low;
  std::vector<Layout> values = layouts;
  auto step = [&](OpType type, std::vector<int> args, bool pinned) {
    const Op step_op{.type = type};
    std::vector<Layout> in;
    for (int a : args) in.push_back(values[static_cast<std::size_t>(a)]);
    std::optional<ResultTarget> target;
    if (pinned) target = ResultTarget{.placements = rows};
    Strategy s = choose_strategy(step_op, in, options, target);
    Layout layout =
        pinned ? make_layout(logits.mesh, rows, s.output.shape, s.output.dtype) : s.output;
    low.cost_s += s.cost_s;
    values.push_back(layout);
    low.steps.push_back({step_op, std::move(args), std::move(s), std::move(layout)});
    return static_cast<int>(values.size()) - 1;
  };
  const int max = step(OpType::kLogitMax, {0}, true);
  const int stats = step(OpType::kLogitStats, {0, max, 1}, true);
  if (op.type == OpType::kSoftmaxCrossEntropy) {
    step(OpType::kCrossEntropyFromStats, {max, stats}, false);
  } else {
    step(OpType::kCrossEntropyGradFromStats, {0, 1, max, stats, 2}, false);
  }
  return low;
}

}  // namespace meshflow
