#include "meshflow/ops/layer_norm.h"

#include <cmath>

#include "meshflow/core/error.h"
#include "meshflow/kernels/layer_norm.h"

namespace meshflow {

bool is_layer_norm_family(OpType t) {
  return t == OpType::kLayerNorm || t == OpType::kLayerNormGradX || t == OpType::kLayerNormGradW;
}

TensorSpec infer_layer_norm(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, in, true);
  const Shape& x = in[op.type == OpType::kLayerNorm ? 0 : 1].shape;
  if (x.empty()) fail(ErrorKind::kShapeMismatch, "{}: operand x is a scalar", name);
  const Shape d{x.back()};
  if (op.type != OpType::kLayerNorm && in[0].shape != x) {
    fail(ErrorKind::kShapeMismatch, "{}: gradient {} and x {} differ", name, to_string(in[0].shape),
         to_string(x));
  }
  // w and b (layer_norm), w (layer_norm_grad_x) are [D]
  const std::size_t first_param = op.type == OpType::kLayerNorm ? 1 : 2;
  for (std::size_t i = first_param; i < in.size(); ++i) {
    if (in[i].shape != d) {
      fail(ErrorKind::kShapeMismatch, "{}: operand {} is {} but x {} needs {}", name, i,
           to_string(in[i].shape), to_string(x), to_string(d));
    }
  }
  if (!(op.eps > 0)) fail(ErrorKind::kInvalidArgument, "{}: eps {} is not > 0", name, op.eps);
  return {op.type == OpType::kLayerNormGradW ? d : x, in[0].dtype};
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

// float32: the vector row loops of kernels/layer_norm.h.
Tensor run_float(const Op& op, const std::vector<const Tensor*>& in) {
  const bool forward = op.type == OpType::kLayerNorm;
  const Tensor& x = *in[forward ? 0 : 1];
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  const float* px = x.data<float>().data();
  const auto eps = static_cast<float>(op.eps);
  if (op.type == OpType::kLayerNormGradW) {
    Tensor gw(x.dtype(), {d});
    layer_norm_grad_w_rows(in[0]->data<float>().data(), px, gw.data<float>().data(), rows, d, eps);
    return gw;
  }
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  if (forward) {
    layer_norm_rows(px, in[1]->data<float>().data(), in[2]->data<float>().data(),
                    y.data<float>().data(), rows, d, eps);
  } else {
    layer_norm_grad_x_rows(in[0]->data<float>().data(), px, in[2]->data<float>().data(),
                           y.data<float>().data(), rows, d, eps);
  }
  return y;
}

// float64: plain loops (the float32 kernels' reference).
Tensor run_double(const Op& op, const std::vector<const Tensor*>& in) {
  using T = double;
  const bool forward = op.type == OpType::kLayerNorm;
  const Tensor& x = *in[forward ? 0 : 1];
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  const T* px = x.data<T>().data();
  if (op.type == OpType::kLayerNormGradW) {
    Tensor gw(x.dtype(), {d});
    std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
    const T* pg = in[0]->data<T>().data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [mean, rstd] = row_stats(px + r * d, d, op.eps);
      for (std::int64_t j = 0; j < d; ++j)
        acc[static_cast<std::size_t>(j)] += pg[r * d + j] * (px[r * d + j] - mean) * rstd;
    }
    for (std::int64_t j = 0; j < d; ++j)
      gw.data<T>()[static_cast<std::size_t>(j)] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    return gw;
  }
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  T* py = y.data<T>().data();
  if (forward) {
    const T* w = in[1]->data<T>().data();
    const T* b = in[2]->data<T>().data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [mean, rstd] = row_stats(px + r * d, d, op.eps);
      for (std::int64_t j = 0; j < d; ++j)
        py[r * d + j] = static_cast<T>((px[r * d + j] - mean) * rstd * w[j] + b[j]);
    }
    return y;
  }
  // gx = rstd * (gw - mean(gw) - x̂ * mean(gw * x̂)), gw = g * w
  const T* pg = in[0]->data<T>().data();
  const T* w = in[2]->data<T>().data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * d;
    const T* gr = pg + r * d;
    const auto [mean, rstd] = row_stats(xr, d, op.eps);
    double m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double gw = static_cast<double>(gr[j]) * w[j];
      m1 += gw;
      m2 += gw * (xr[j] - mean) * rstd;
    }
    m1 /= static_cast<double>(d);
    m2 /= static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) {
      const double gw = static_cast<double>(gr[j]) * w[j];
      py[r * d + j] = static_cast<T>(rstd * (gw - m1 - (xr[j] - mean) * rstd * m2));
    }
  }
  return y;
}

}  // namespace

Tensor layer_norm_kernel(const Op& op, const std::vector<const Tensor*>& in) {
  return in[0]->dtype() == DType::kFloat64 ? run_double(op, in) : run_float(op, in);
}

bool are_layer_norm_weight_grads(const Op& a, const Op& b, const std::vector<TensorSpec>& in) {
  const auto is = [&](OpType x, OpType y) { return a.type == x && b.type == y; };
  if (!is(OpType::kLayerNormGradW, OpType::kSumTo) && !is(OpType::kSumTo, OpType::kLayerNormGradW))
    return false;
  const Op& sum = a.type == OpType::kSumTo ? a : b;
  const Op& grad_w = a.type == OpType::kSumTo ? b : a;
  return in.size() == 2 && !in[0].shape.empty() && in[0].shape == in[1].shape &&
         in[0].dtype == in[1].dtype && is_floating(in[0].dtype) &&
         sum.shape == Shape{in[0].shape.back()} && grad_w.eps > 0;
}

std::vector<Tensor> layer_norm_weight_grads_kernel(std::span<const Op> ops,
                                                   const std::vector<const Tensor*>& in) {
  MESHFLOW_CHECK(ops.size() == 2 && in.size() == 2);
  const bool sum_first = ops[0].type == OpType::kSumTo;
  const Op& grad_w = ops[sum_first ? 1 : 0];
  std::vector<Tensor> out;
  if (in[0]->dtype() != DType::kFloat32) {  // float64: each alone
    for (const Op& op : ops)
      out.push_back(op.type == OpType::kSumTo ? run_kernel(op, {in[0]}, {spec_of(*in[0])})
                                              : layer_norm_kernel(op, in));
    return out;
  }
  const Tensor& x = *in[1];
  const std::int64_t d = x.shape().back();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  Tensor gw(x.dtype(), {d}), gb(x.dtype(), {d});
  layer_norm_grad_wb_rows(in[0]->data<float>().data(), x.data<float>().data(),
                          gw.data<float>().data(), gb.data<float>().data(), rows, d,
                          static_cast<float>(grad_w.eps));
  out.push_back(std::move(sum_first ? gb : gw));
  out.push_back(std::move(sum_first ? gw : gb));
  return out;
}

DimLabels layer_norm_labels(const Op& op, const std::vector<TensorSpec>& in) {
  DimLabels l;
  const int r = static_cast<int>(in[op.type == OpType::kLayerNorm ? 0 : 1].shape.size());
  const std::vector<int> x = label_range(0, r), d = {r - 1};
  l.unshardable = d;
  switch (op.type) {
    case OpType::kLayerNorm:
      l.inputs = {x, d, d};
      l.output = x;
      break;
    case OpType::kLayerNormGradX:
      l.inputs = {x, x, d};
      l.output = x;
      l.factors = {0};
      break;
    default:  // layer_norm_grad_w: the leading dims are summed away
      l.inputs = {x, x};
      l.output = d;
      l.factors = {0};
      break;
  }
  return l;
}

}  // namespace meshflow
