// FlexFlow's parallel operators in terms of a layout's degrees. A layout has, per tensor dim, a
// shard degree (the product of the sizes of the mesh dims that shard it), a partial degree (the
// product over Partial mesh dims) and a replica degree (over Replicate mesh dims). Repartition
// multiplies one dim's shard degree, combine divides it, replicate multiplies the replica
// degree and reduction divides the partial degree; every other shard and partial degree stays
// (the replica degree may trade against the changed one). Forward / backward data movement:
// replicate broadcast / sum-reduce, repartition scatter / gather, combine gather / scatter,
// reduction sum-reduce / broadcast; graph/expand_backward.h turns each backward into a move of
// the gradient to its input's gradient layout, which plans exactly those collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/graph/pcg.h"

namespace meshflow {

struct Degrees {
  std::vector<std::int64_t> shard;  // per tensor dim
  std::int64_t partial = 1;
  std::int64_t replica = 1;
  bool operator==(const Degrees&) const = default;
};

// Returns the degrees of `layout`.
Degrees degrees(const Layout& layout);

// Returns "shard [2,1] partial 1 replica 2".
std::string to_string(const Degrees& d);

// Throws Error(kInvalidArgument) naming the node, the degree and both layouts when `out` is not
// what `node` (a parallel op) makes of `in`.
void check_parallel_op(const Node& node, const Layout& in, const Layout& out);

// Returns the placements the gradient of a value of `layout` takes where a gradient must be
// given a layout (a parallel op's backward, the loss's seed): Shard and Replicate as the value,
// Partial replaced by Replicate (every term of a sum receives the whole gradient).
std::vector<Placement> gradient_placements(const Layout& layout);

}  // namespace meshflow
