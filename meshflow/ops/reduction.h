// Reductions and their inverses: sum and mean over dims (dims dropped), sum_to (summing a
// broadcast result back down to an operand's shape) and broadcast_to (the gradient of sum and
// mean: inserted dims, broadcast, scaled). A mean divides by the global count of the reduced
// elements, so on a shard it yields that shard's term of the global mean.
#pragma once

#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

bool is_reduction_family(OpType type);  // sum, mean, sum_to, broadcast_to

TensorSpec infer_reduction(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor reduction_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const std::vector<TensorSpec>& globals);

// Returns the dims of `from` that summing down to `to` removes or collapses to 1 (leading dims
// `to` lacks, and dims where `to` is 1 and `from` is not), in `from`'s numbering; throws Error
// when `from` does not broadcast from `to`.
std::vector<int> sum_to_dims(const Shape& from, const Shape& to);

// The family's sharding rule (op.h's DimLabels) for a result of shape `out`.
DimLabels reduction_labels(const Op& op, const std::vector<TensorSpec>& inputs, const Shape& out);

}  // namespace meshflow
