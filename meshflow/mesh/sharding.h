// Splitting a global tensor into per-device shards under a Layout, and assembling shards back
// (reducing Partial terms, checking that replicas agree).
#pragma once

#include <optional>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/mesh/layout.h"

namespace meshflow {

// Returns one tensor per mesh device (row-major mesh order) holding its shard box of `global`.
// Preconditions (throws Error): global's shape and dtype match the layout; no Partial placement
// (a full value cannot be split into terms without choosing a convention; redistribute does it).
std::vector<Tensor> shard_tensor(const Tensor& global, const Layout& layout);

// One reduction equivalent to reducing Partial dims with ops `ops` (sizes `sizes`) together:
// when every op is sum or avg, a sum followed by division by the product of the avg dims'
// sizes; when all ops are equal, that op (divisor 1). Mixed ops have none (nullopt).
struct FlatReduction {
  ReduceOp op;
  std::int64_t divisor;
};
std::optional<FlatReduction> flat_reduction(const std::vector<ReduceOp>& ops,
                                            const std::vector<std::int64_t>& sizes);

// Writes into `out` (n elements) the value of Partial terms laid out as the devices of a group
// along Partial mesh dims with sizes `sizes` and ops `ops`, `terms` in row-major order over
// those dims. When every op is sum or avg: the flat sum in that order divided by the product of
// the avg dims' sizes; when all ops are equal: the flat op; otherwise the innermost dim reduces
// first. `out` may be one of the terms.
void reduce_partial_terms(const std::vector<ReduceOp>& ops, const std::vector<std::int64_t>& sizes,
                          DType dtype, const std::vector<const std::byte*>& terms, std::byte* out,
                          std::int64_t n);

// Returns the global tensor the shards represent. Partial mesh dims are reduced: when every
// Partial op is sum or avg, all terms are summed in row-major mesh order and divided by the
// product of the avg dims' sizes; when all are max (or all min) the same flat order is used;
// mixed ops reduce the innermost Partial mesh dim first. Replicas must agree (bitwise; within a
// float tolerance where Partial sums are involved). Throws Error naming the device and box
// for a wrong shard count, dtype or shape, or for disagreeing replicas.
Tensor assemble(const Layout& layout, const std::vector<Tensor>& shards);

}  // namespace meshflow
