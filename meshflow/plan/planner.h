// plan_redistribute: the cheapest plan, by the cost model, among the candidate planners:
//   per_dim          DTensor's transition table applied one mesh dim at a time (inner dims
//                    released first, then outer dims chunked first)
//   per_dim_merged   per_dim with adjacent like collectives merged onto flattened groups
//   search           Dijkstra over placement states, merged moves included as edges
//   point_to_point   every device receives exactly the regions it lacks in one exchange
// Cross-mesh redistribution uses point_to_point. Planning is pure: it never touches a backend.
#pragma once

#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

struct PlanOptions {
  const MachineModel* machine = nullptr;  // default_machine() when null
  // The search explores every subset of mesh dims at every state, exponential in their number:
  // it is a candidate only for meshes with at most this many dims of size > 1.
  int max_search_mesh_dims = 4;
};

// Returns the chosen plan; throws Error naming the offending mesh dim and placements for
// Shard -> Partial, Partial(a) -> Partial(b), or a shape / dtype mismatch. Deterministic.
Plan plan_redistribute(const Layout& from, const Layout& to, const PlanOptions& options = {});

// The individual candidates (for tests and `meshflow plan`); each returns its steps.
std::vector<Step> plan_per_dim(const Layout& from, const Layout& to, const MachineModel& machine);
std::vector<Step> merge_steps(const Layout& from, const std::vector<Step>& steps,
                              const MachineModel& machine);
std::vector<Step> plan_search(const Layout& from, const Layout& to, const MachineModel& machine);

}  // namespace meshflow
