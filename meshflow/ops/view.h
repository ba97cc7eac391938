// Views: reshape (C order, NumPy's reshape, one -1 allowed; attribute `shape`) and transpose
// (NumPy's transpose(axes); attribute `dims`, empty for reversed). Both keep every element's
// value; only its index changes.
//
// Sharding. Transpose permutes the placements' dims: its labels carry every operand dim to its
// result dim, so any layout runs on the shards as they are. Reshape is read as dim groups
// (Shardy's factor view): the shortest runs of operand dims and result dims that hold the same
// elements (equal products). A group's elements are a row-major block, so a shard of its
// outermost operand dim is a shard of its outermost result dim exactly when every device's
// operand shard and result shard cover the same flat range of the group (even splits, or chunks
// that agree). reshape_keeps_shards checks that for a pair of layouts; ops/strategy.cc keeps only
// the pairs it accepts, so a reshape never gives wrong numbers and redistributes first (to the
// cheapest layout where it is exact) when the shards do not map.
#pragma once

#include <vector>

#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"

namespace meshflow {

bool is_view_family(OpType type);  // reshape, transpose

// Resolves the -1 of a reshape and checks it; sorts out transpose's default and negative dims.
Op normalize_view(const Op& op, const std::vector<TensorSpec>& inputs);
TensorSpec infer_view(const Op& op, const std::vector<TensorSpec>& inputs);
// Runs on a shard: a reshape's result dims are the operand's, group by group, with a group's
// outermost result dim holding what the shard holds of the group (see reshape_keeps_shards).
Tensor view_kernel(const Op& op, const std::vector<const Tensor*>& in,
                   const std::vector<TensorSpec>& globals);
DimLabels view_labels(const Op& op, const std::vector<TensorSpec>& inputs, const Shape& out);

// Operand dims [in_begin, in_end) and result dims [out_begin, out_end) of a reshape that hold the
// same elements. A size-1 dim on one side only is a group of its own with no dim on the other.
struct DimGroup {
  int in_begin = 0, in_end = 0, out_begin = 0, out_end = 0;
  bool operator==(const DimGroup&) const = default;
};

// Returns the groups of a reshape from `from` to `to` (equal element counts), shortest first, in
// dim order. A shape with no elements is one group of all dims.
std::vector<DimGroup> reshape_groups(const Shape& from, const Shape& to);

// Returns whether reshaping each device's shard of `in` (placements as they are) gives exactly
// its shard of `out`: per group, the two shards cover the same contiguous flat range of the
// group, and the result shard spans every result dim of the group but the outermost (what
// view_kernel assumes). Partial and Replicate mesh dims must match. Layouts on one mesh.
bool reshape_keeps_shards(const Layout& in, const Layout& out);

}  // namespace meshflow
