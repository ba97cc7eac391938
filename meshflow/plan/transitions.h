// The redistribution state machine shared by every planner.
//
// State: the placements of a tensor on a fixed mesh (one per mesh dim); the global shape and
// dtype never change. A move changes the placements of a set D of mesh dims at once:
//
//   S(d) -> R     all_gather       every dim of D, one tensor dim d
//   P(op) -> R    all_reduce       every dim of D; ops all sum/avg, or all max, or all min
//   P(op) -> S(d) reduce_scatter   every dim of D, one tensor dim d
//   S(i) -> S(j)  all_to_all       one dim only (never merged)
//   R -> S(d)     local chunk      any dims
//   R -> P(op)    local            any dims (sum divides by the dim's size, others keep values)
//
// Invariants a valid move keeps (they make every move a collective over groups along D whose
// members' shard boxes tile each other's new boxes in rank order):
//   1. No mesh dim of size > 1 outside D and inner to min(D) (larger index) shards a tensor dim
//      the move shards or unshards: chunks apply outer mesh dim first, so only the innermost
//      shards of a tensor dim can change without moving every inner chunk.
//   2. A merged all_gather / reduce_scatter (|D| > 1) needs the tensor dim's size to divide
//      evenly by the product of all mesh dims sharding it up to max(D) (DESIGN.md's rule).
//   3. Shard -> Partial and Partial(a) -> Partial(b), a != b, never happen (they are errors).
//   4. Mixed Partial ops mean "innermost mesh dim reduces first" (sum and avg mix freely; max
//      and min mix with nothing else), so a move may reduce a Partial dim only when no inner
//      Partial dim it leaves behind has an incompatible op.
// Mesh dims of size 1 hold the whole tensor along that dim: they take their target placement
// up front, with no step.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "meshflow/core/reduce_op.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

struct Move {
  StepKind kind;
  std::vector<MeshDim> dims;  // ascending
  std::vector<Placement> after;
};

// Throws Error naming the mesh dim and placements when `from` cannot become `to`: Shard ->
// Partial, Partial(a) -> Partial(b), or a different shape or dtype.
void check_redistributable(const Layout& from, const Layout& to);

// Returns `placements` with every size-1 mesh dim set to its target.
std::vector<Placement> settle_unit_dims(const DeviceMesh& mesh, std::vector<Placement> placements,
                                        const std::vector<Placement>& target);

// Returns the move's kind if turning `before` into `after` (differing exactly on `dims`) is a
// valid move under the invariants above, nullopt otherwise.
std::optional<StepKind> classify_move(const Layout& before, const std::vector<Placement>& after,
                                      const std::vector<MeshDim>& dims);

// Returns the step for a valid move, with bytes (max per device from the largest shard) and an
// estimated time from `machine`. Totals over devices are filled by fill_totals.
Step make_step(const Layout& before, const Move& move, const MachineModel& machine);

// Fills total_bytes of every step (summing over every device) and returns the plan's total.
std::int64_t fill_totals(const Layout& from, std::vector<Step>& steps);

// Returns the source's Partial mesh dims whose terms a direct move to `to` must reduce, in
// ascending order: all of them across meshes; on one mesh, those not Partial with the same op
// in `to`, and those whose terms cannot survive an outer reduced dim (invariant 4).
std::vector<MeshDim> reduced_partial_dims(const Layout& from, const Layout& to);

// The sizes a device's part of a move between two layouts of one mesh depends on: the
// elements of its shard before and after and of their intersection, and how many distinct
// `before` shards (by their Shard coordinates) meet its `after` shard.
struct ShardSizes {
  std::int64_t before = 0, after = 0, common = 0, sources = 0;
  auto operator<=>(const ShardSizes&) const = default;
};

// Returns how many devices of the (shared) mesh have each ShardSizes, without visiting every
// device: a shard's extent on a tensor dim depends only on the coordinates of the mesh dims that
// shard that dim, so the tensor dims fall into groups (tied where one mesh dim shards two of
// them, before and after) whose mesh dims' coordinates are enumerated alone, and the groups'
// sizes multiply. Mesh dims that shard nothing multiply the counts. The work is the largest
// group's coordinates, not the mesh's devices, and none where every level divides evenly and
// one layout's sharding refines the other's.
std::map<ShardSizes, std::int64_t> sizes_histogram(const Layout& before, const Layout& after);

// Returns the nonempty intervals the shards of `l` cut tensor dim t into, ascending.
std::vector<Chunk> shard_intervals(const Layout& l, std::size_t t);

// Returns how many of `intervals` (disjoint, ascending) share an element with `c`.
std::int64_t count_meeting(const std::vector<Chunk>& intervals, Chunk c);

// Returns the bytes a device must receive under any plan, summed over devices (a lower bound).
std::int64_t min_bytes(const Layout& from, const Layout& to);

// Returns true when Partial ops `a` and `b` reduce together (both sum/avg, or equal).
bool compatible_ops(ReduceOp a, ReduceOp b);

// Returns how a step turns Replicate into Partial(sum) values of `dtype` (the one place the
// Replicate -> Partial rule is decided; see PartialSplit).
PartialSplit partial_split_rule(DType dtype);

// Returns the flat reduction (op and divisor) that reduces Partial mesh dims `dims` of `before`
// together; the dims must reduce together (a valid move).
FlatReduction reduction_of(const Layout& before, const std::vector<MeshDim>& dims);

// Returns `layout` with its placements replaced.
Layout with_placements(const Layout& layout, std::vector<Placement> placements);

}  // namespace meshflow
