// Plan: what a redistribution planner returns, as plain data: ordered steps (a collective on
// groups along mesh dims, a local chunk or scale, or one point-to-point exchange), with bytes
// and estimated time per step, a canonical text form (for golden files) and JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/core/box.h"
#include "meshflow/core/reduce_op.h"
#include "meshflow/mesh/layout.h"

namespace meshflow {

// kPermute, kBroadcast and kInPlace are the steps of a decomposed collective
// (graph/decompose.cc); the planner never chooses them. kInPlace: every device reads its peers'
// blocks where they lie (devices sharing one address space), with a collective before (the
// blocks' addresses) and a barrier after.
enum class StepKind {
  kAllGather,
  kAllReduce,
  kReduceScatter,
  kAllToAll,
  kPointToPoint,
  kLocal,
  kPermute,
  kBroadcast,
  kInPlace
};

// Returns "all_gather", ..., "point_to_point", "local", "permute", "broadcast", "in_place".
std::string_view to_string(StepKind kind);

// One region a point-to-point step moves: box (global coordinates) of partial term `term` (0
// when the source is not reduced) from device src to device dst.
struct Transfer {
  DeviceId src;
  DeviceId dst;
  int term;
  Box box;
  bool operator==(const Transfer&) const = default;
};

// DESIGN's Replicate -> Partial(sum) rule, as a step applies it on the mesh dims it turns from
// Replicate into Partial(sum): floating-point values are divided by the number of devices along
// those dims (DTensor's rule); integer values stay on the first device along them (coordinate 0
// on each) and are 0 on the others, so no integer is lost to truncation.
enum class PartialSplit { kNone, kDivide, kFirstKeeps };

// Returns "none", "divide", "first_keeps".
std::string_view to_string(PartialSplit split);

// Invariants: collective and local steps run on the source mesh and turn placements `before`
// into `after`, changing exactly the mesh dims in `mesh_dims` (ascending); a point-to-point
// step turns the source layout into the destination layout (its `before`/`after` are those
// layouts' placements) and counts its transfers, which follow from the two layouts
// (plan/point_to_point.h builds them for the devices that run them). Every decision the executor
// needs is here or follows mechanically from it (plan/lower.h): nothing is decided while running.
struct Step {
  StepKind kind = StepKind::kLocal;
  std::vector<MeshDim> mesh_dims;
  std::vector<Placement> before, after;
  std::int64_t bytes_per_device = 0;  // the most any device receives
  std::int64_t total_bytes = 0;       // received, summed over devices
  double est_s = 0;
  // Reducing steps (all_reduce, reduce_scatter, point_to_point with terms > 1): the Partial
  // mesh dims of `before` reduced, in mesh order; with ops all sum/avg or all equal, one flat
  // reduction `op` in rank order followed by division by `divisor` (the avg dims' sizes);
  // point_to_point with mixed ops reduces the innermost dim first.
  std::vector<MeshDim> reduced_dims;
  ReduceOp op = ReduceOp::kSum;
  std::int64_t divisor = 1;
  // The mesh dims (of the destination mesh) this step turns from Replicate into Partial(sum),
  // and how (local and point_to_point steps).
  std::vector<MeshDim> split_dims;
  PartialSplit split = PartialSplit::kNone;
  std::int64_t transfers = 0;  // point_to_point: pieces moved, each device's own included
  int terms = 1;               // point_to_point: partial terms each device reduces
  bool operator==(const Step&) const = default;
};

// A candidate that lost, for `meshflow plan` to show.
struct Alternative {
  std::string planner;
  double est_s = 0;
  std::int64_t total_bytes = 0;
  int steps = 0;
};

struct Plan {
  Layout from, to;
  std::string planner;  // which candidate won: per_dim, per_dim_merged, search, point_to_point
  std::vector<Step> steps;
  double est_s = 0;
  std::int64_t total_bytes = 0;
  std::int64_t min_bytes = 0;  // lower bound on total_bytes for any plan
  std::vector<Alternative> alternatives;
};

// Returns the canonical multi-line text form (stable; golden files depend on it).
std::string to_text(const Plan& plan);

// Meshes of more devices than this get "devices": null in the plan JSON (a step's groups are
// its mesh dims, "group_shape"; listing 65,536 devices per step made megabytes of JSON).
inline constexpr std::int64_t kPlanJsonMaxDevices = 4096;

// Returns DESIGN.md's plan JSON: {"planner", "est_s", "min_bytes", "steps": [{"kind",
// "mesh_dims", "devices", "bytes_per_device", "est_s"}], ...} plus "total_bytes" and
// "alternatives".
nlohmann::json to_json(const Plan& plan);

// Returns every device of the source and destination meshes, ascending.
std::vector<DeviceId> plan_devices(const Plan& plan);

// Returns the devices a step involves: the source mesh's for collectives and local steps, both
// meshes' for point_to_point (one exchange among all of them, some sending nothing).
std::vector<DeviceId> step_devices(const Plan& plan, const Step& step);

}  // namespace meshflow
