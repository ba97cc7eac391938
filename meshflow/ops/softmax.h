// Softmax and the losses: softmax over a dim, softmax_cross_entropy(logits[B, C], labels[B]) (mean
// over B of -log softmax(logits)[label]), mse(a, b) (mean of (a - b)²), and their gradients.
// Means divide by global counts (the batch B, the element count), so a batch shard yields its
// term of the global loss; softmax needs its whole dim on one device (its strategies gather it),
// while softmax_cross_entropy and its gradient may shard the classes: such a strategy runs
// vocabulary-parallel (ops/vocab_parallel.h).
#pragma once

#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_softmax_family(OpType type);  // softmax, softmax_grad, the losses and their gradients

TensorSpec infer_softmax(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor softmax_kernel(const Op& op, const std::vector<const Tensor*>& in,
                      const std::vector<TensorSpec>& globals);

// Returns row `row`'s label of int32/int64 `labels`; throws Error naming it unless it lies in
// [0, classes) (the global class count, so every shard of a vocabulary-parallel loss agrees).
std::int64_t class_label(const Tensor& labels, std::int64_t row, std::int64_t classes);

// The family's sharding rule (op.h's DimLabels) for a result of shape `out`.
DimLabels softmax_labels(const Op& op, const std::vector<TensorSpec>& inputs, const Shape& out);

}  // namespace meshflow
