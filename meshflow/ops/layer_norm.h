// Layer normalisation over the last dim: layer_norm(x[..., D], w[D], b[D]) {eps} =
// (x - mean) / sqrt(var + eps) * w + b with the biased variance, and its gradients, which read
// the rows' statistics as the forward pass can keep them: layer_norm_stats(x) {eps} = [...,
// kNormStatsFloats] (kernels/layer_norm.h: x̂ = (x - s[0]) s[1] + s[2]), layer_norm_grad_x(g,
// x, w, stats) the gradient of x, layer_norm_grad_w(g, x, stats) = Σ over the leading dims of
// g * x̂ (the gradient of b is sum_to(g, [D])). Statistics need the whole last dim on one device,
// so no strategy shards it; the leading dims shard freely, and layer_norm_grad_w of a shard of
// them is a Partial(sum) term.
#pragma once

#include <span>
#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_layer_norm_family(OpType type);  // layer_norm, its statistics and its gradients

TensorSpec infer_layer_norm(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor layer_norm_kernel(const Op& op, const std::vector<const Tensor*>& in);

// Whether `a` and `b` run as one pass over operands `in`: layer_norm(x, w, b) and
// layer_norm_stats(x) of the same eps (the forward pass keeps the statistics it makes), or
// layer_norm_grad_w(g, x, stats) and sum_to(g, [D]) (the scale's and the bias's gradients, one
// pass over g); either first.
bool layer_norm_runs_together(const Op& a, const Op& b, const std::vector<TensorSpec>& in);
// Runs them (`ops`, as layer_norm_runs_together takes them, each reading the first of `in` it
// takes) in one pass in float32, each alone in float64; returns their results in `ops`' order,
// each bit for bit what it is alone.
std::vector<Tensor> layer_norm_kernels(std::span<const Op> ops,
                                       const std::vector<const Tensor*>& in);

// The elementwise steps of the family's kernel on operands of `local` shapes (op.h's
// work_points): one per element of x, every operator of the family a pass or two over x's rows.
double layer_norm_work(const Op& op, const std::vector<Shape>& local);

// The family's sharding rule (op.h's DimLabels).
DimLabels layer_norm_labels(const Op& op, const std::vector<TensorSpec>& inputs);

}  // namespace meshflow
