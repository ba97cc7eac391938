#include "meshflow/ops/layer_norm.h"

#include <cmath>

#include "meshflow/core/error.h"
#include "meshflow/kernels/layer_norm.h"

namespace meshflow {

bool is_layer_norm_family(OpType t) {
  return t == OpType::kLayerNorm || t == OpType::kLayerNormStats || t == OpType::kLayerNormGradX ||
         t == OpType::kLayerNormGradW;
}

namespace {

// The operand that is x, and the one that holds the rows' statistics (none: -1).
int x_operand(OpType t) { return t == OpType::kLayerNorm || t == OpType::kLayerNormStats ? 0 : 1; }
int stats_operand(OpType t) {
  return t == OpType::kLayerNormGradX ? 3 : t == OpType::kLayerNormGradW ? 2 : -1;
}

// x's shape with its last dim replaced by the statistics'.
Shape stats_shape(Shape x) {
  x.back() = kNormStatsFloats;
  return x;
}

}  // namespace

TensorSpec infer_layer_norm(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, in, true);
  const Shape& x = in[static_cast<std::size_t>(x_operand(op.type))].shape;
  if (x.empty()) fail(ErrorKind::kShapeMismatch, "{}: operand x is a scalar", name);
  const Shape d{x.back()};
  if (x_operand(op.type) == 1 && in[0].shape != x) {
    fail(ErrorKind::kShapeMismatch, "{}: gradient {} and x {} differ", name, to_string(in[0].shape),
         to_string(x));
  }
  // w and b (layer_norm), w (layer_norm_grad_x) are [D]; the statistics [..., 3]
  const int stats = stats_operand(op.type);
  for (std::size_t i = static_cast<std::size_t>(x_operand(op.type)) + 1; i < in.size(); ++i) {
    const Shape want = static_cast<int>(i) == stats ? stats_shape(x) : d;
    if (in[i].shape != want) {
      fail(ErrorKind::kShapeMismatch, "{}: operand {} is {} but x {} needs {}", name, i,
           to_string(in[i].shape), to_string(x), to_string(want));
    }
  }
  if (!(op.eps > 0)) fail(ErrorKind::kInvalidArgument, "{}: eps {} is not > 0", name, op.eps);
  switch (op.type) {
    case OpType::kLayerNormStats:
      return {stats_shape(x), in[0].dtype};
    case OpType::kLayerNormGradW:
      return {d, in[0].dtype};
    default:
      return {x, in[0].dtype};
  }
}

namespace {

// The mean and 1 / sqrt(var + eps) of one row of d float64 elements.
std::pair<double, double> row_stats(const double* x, std::int64_t d, double eps) {
  double mean = 0;
  for (std::int64_t j = 0; j < d; ++j) mean += x[j];
  mean /= static_cast<double>(d);
  double var = 0;
  for (std::int64_t j = 0; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
  var /= static_cast<double>(d);
  return {mean, 1 / std::sqrt(var + eps)};
}

// float32: the vector row loops of kernels/layer_norm.h; the forward pass keeps the statistics
// where `stats` is given.
Tensor run_float(const Op& op, const std::vector<const Tensor*>& in, Tensor* stats = nullptr) {
  const Tensor& x = *in[static_cast<std::size_t>(x_operand(op.type))];
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  const float* px = x.data<float>().data();
  const auto eps = static_cast<float>(op.eps);
  const auto at = [&](int i) { return in[static_cast<std::size_t>(i)]->data<float>().data(); };
  switch (op.type) {
    case OpType::kLayerNormStats: {
      Tensor out = Tensor::uninitialized(x.dtype(), stats_shape(x.shape()));
      layer_norm_stats_rows(px, out.data<float>().data(), rows, d, eps);
      return out;
    }
    case OpType::kLayerNormGradW: {
      Tensor gw(x.dtype(), {d});
      layer_norm_grad_w_rows(at(0), px, at(2), gw.data<float>().data(), rows, d);
      return gw;
    }
    default:
      break;
  }
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  if (op.type == OpType::kLayerNorm) {
    layer_norm_rows(px, at(1), at(2), y.data<float>().data(),
                    stats ? stats->data<float>().data() : nullptr, rows, d, eps);
  } else {
    layer_norm_grad_x_rows(at(0), px, at(2), at(3), y.data<float>().data(), rows, d);
  }
  return y;
}

// float64: plain loops (the float32 kernels' reference). A row's statistics are {mean, rstd, 0},
// so x̂ = (x - mean) rstd as the float32 kernels' x̂ = (x - s[0]) s[1] + s[2] reads them.
Tensor run_double(const Op& op, const std::vector<const Tensor*>& in) {
  using T = double;
  const Tensor& x = *in[static_cast<std::size_t>(x_operand(op.type))];
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  const T* px = x.data<T>().data();
  if (op.type == OpType::kLayerNormStats) {
    Tensor out = Tensor::uninitialized(x.dtype(), stats_shape(x.shape()));
    T* s = out.data<T>().data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [mean, rstd] = row_stats(px + r * d, d, op.eps);
      s[r * kNormStatsFloats] = mean;
      s[r * kNormStatsFloats + 1] = rstd;
      s[r * kNormStatsFloats + 2] = 0;
    }
    return out;
  }
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  T* py = y.data<T>().data();
  if (op.type == OpType::kLayerNorm) {
    const T* w = in[1]->data<T>().data();
    const T* b = in[2]->data<T>().data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [mean, rstd] = row_stats(px + r * d, d, op.eps);
      for (std::int64_t j = 0; j < d; ++j)
        py[r * d + j] = static_cast<T>((px[r * d + j] - mean) * rstd * w[j] + b[j]);
    }
    return y;
  }
  const T* pg = in[0]->data<T>().data();
  const T* stats = in[static_cast<std::size_t>(stats_operand(op.type))]->data<T>().data();
  const auto xhat = [&](std::int64_t r, std::int64_t j) {
    const T* s = stats + r * kNormStatsFloats;
    return (px[r * d + j] - s[0]) * s[1] + s[2];
  };
  if (op.type == OpType::kLayerNormGradW) {
    Tensor gw(x.dtype(), {d});
    std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < d; ++j)
        acc[static_cast<std::size_t>(j)] += pg[r * d + j] * xhat(r, j);
    for (std::int64_t j = 0; j < d; ++j)
      gw.data<T>()[static_cast<std::size_t>(j)] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    return gw;
  }
  // gx = rstd * (gw - mean(gw) - x̂ * mean(gw * x̂)), gw = g * w
  const T* w = in[2]->data<T>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gr = pg + r * d;
    const double rstd = stats[r * kNormStatsFloats + 1];
    double m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double gw = static_cast<double>(gr[j]) * w[j];
      m1 += gw;
      m2 += gw * xhat(r, j);
    }
    m1 /= static_cast<double>(d);
    m2 /= static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) {
      const double gw = static_cast<double>(gr[j]) * w[j];
      py[r * d + j] = static_cast<T>(rstd * (gw - m1 - xhat(r, j) * m2));
    }
  }
  return y;
}

}  // namespace

Tensor layer_norm_kernel(const Op& op, const std::vector<const Tensor*>& in) {
  return in[0]->dtype() == DType::kFloat64 ? run_double(op, in) : run_float(op, in);
}

bool layer_norm_runs_together(const Op& a, const Op& b, const std::vector<TensorSpec>& in) {
  const auto is = [&](OpType x, OpType y) {
    return (a.type == x && b.type == y) || (a.type == y && b.type == x);
  };
  if (in.empty() || in[0].shape.empty() || !is_floating(in[0].dtype)) return false;
  const Shape& x = in[0].shape;
  if (is(OpType::kLayerNorm, OpType::kLayerNormStats)) {
    const Shape d{x.back()};
    return a.eps == b.eps && a.eps > 0 && in.size() == 3 && in[1].shape == d && in[2].shape == d &&
           in[1].dtype == in[0].dtype && in[2].dtype == in[0].dtype;
  }
  if (!is(OpType::kLayerNormGradW, OpType::kSumTo)) return false;
  const Op& sum = a.type == OpType::kSumTo ? a : b;
  return in.size() == 3 && in[1].shape == x && in[2].shape == stats_shape(x) &&
         in[1].dtype == in[0].dtype && in[2].dtype == in[0].dtype && sum.shape == Shape{x.back()};
}

std::vector<Tensor> layer_norm_kernels(std::span<const Op> ops,
                                       const std::vector<const Tensor*>& in) {
  MESHFLOW_CHECK(ops.size() == 2);
  std::vector<Tensor> out;
  if (in[0]->dtype() != DType::kFloat32) {  // float64: each alone
    for (const Op& op : ops)
      out.push_back(op.type == OpType::kSumTo ? run_kernel(op, {in[0]}, {spec_of(*in[0])})
                                              : layer_norm_kernel(op, in));
    return out;
  }
  // The second of ops is the first's partner: made beside it, then put in ops' order.
  const bool swapped = ops[0].type == OpType::kSumTo || ops[0].type == OpType::kLayerNormStats;
  const Op& main = ops[swapped ? 1 : 0];
  const Tensor& x = *in[main.type == OpType::kLayerNorm ? 0 : 1];
  Tensor made, partner;
  if (main.type == OpType::kLayerNorm) {
    partner = Tensor::uninitialized(x.dtype(), stats_shape(x.shape()));
    made = run_float(main, in, &partner);
  } else {
    const std::int64_t d = x.shape().back();
    const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
    made = Tensor(x.dtype(), {d});
    partner = Tensor(x.dtype(), {d});
    layer_norm_grad_wb_rows(in[0]->data<float>().data(), x.data<float>().data(),
                            in[2]->data<float>().data(), made.data<float>().data(),
                            partner.data<float>().data(), rows, d);
  }
  out.push_back(std::move(swapped ? partner : made));
  out.push_back(std::move(swapped ? made : partner));
  return out;
}

double layer_norm_work(const Op& op, const std::vector<Shape>& local) {
  return static_cast<double>(numel(local[static_cast<std::size_t>(x_operand(op.type))]));
}

DimLabels layer_norm_labels(const Op& op, const std::vector<TensorSpec>& in) {
  DimLabels l;
  const int r = static_cast<int>(in[static_cast<std::size_t>(x_operand(op.type))].shape.size());
  // x's dims, its last (D), and the statistics' dims: x's leading ones and their own last.
  const std::vector<int> x = label_range(0, r), d = {r - 1};
  std::vector<int> stats = label_range(0, r - 1);
  stats.push_back(r);
  l.unshardable = {r - 1};
  if (op.type != OpType::kLayerNorm) l.unshardable.push_back(r);
  switch (op.type) {
    case OpType::kLayerNorm:
      l.inputs = {x, d, d};
      l.output = x;
      break;
    case OpType::kLayerNormStats:
      l.inputs = {x};
      l.output = stats;
      break;
    case OpType::kLayerNormGradX:
      l.inputs = {x, x, d, stats};
      l.output = x;
      l.factors = {0};
      break;
    default:  // layer_norm_grad_w: the leading dims are summed away
      l.inputs = {x, x, stats};
      l.output = d;
      l.factors = {0};
      break;
  }
  return l;
}

}  // namespace meshflow
