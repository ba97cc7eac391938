// Layer normalisation over the last dim: layer_norm(x[..., D], w[D], b[D]) {eps} =
// (x - mean) / sqrt(var + eps) * w + b with the biased variance, and its gradients:
// layer_norm_grad_x(g, x, w) the gradient of x, layer_norm_grad_w(g, x) = Σ over the leading
// dims of g * x̂ (x̂ the normalised x; the gradient of b is sum_to(g, [D])). Statistics need the
// whole last dim on one device, so no strategy shards it; the leading dims shard freely, and
// layer_norm_grad_w of a shard of them is a Partial(sum) term.
#pragma once

#include <span>
#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_layer_norm_family(OpType type);  // layer_norm and its gradients

TensorSpec infer_layer_norm(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor layer_norm_kernel(const Op& op, const std::vector<const Tensor*>& in);

// Whether `a` and `b` are layer_norm_grad_w(g, x) and sum_to(g, [D]) (either first) on operands
// `in` = (g, x): the scale's and the bias's gradients, which one pass over g can make.
bool are_layer_norm_weight_grads(const Op& a, const Op& b, const std::vector<TensorSpec>& in);
// Runs them (`ops`, as are_layer_norm_weight_grads takes them; sum_to reads in[0] alone) in one
// pass over g and x (kernels/layer_norm.h's layer_norm_grad_wb_rows) in float32, each alone in
// float64; returns their results in `ops`' order, each bit for bit what it is alone.
std::vector<Tensor> layer_norm_weight_grads_kernel(std::span<const Op> ops,
                                                   const std::vector<const Tensor*>& in);

// The family's sharding rule (op.h's DimLabels).
DimLabels layer_norm_labels(const Op& op, const std::vector<TensorSpec>& inputs);

}  // namespace meshflow
