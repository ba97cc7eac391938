// The point-to-point planner: each destination device receives exactly the regions of its
// destination shard it does not hold, from source devices that hold them, in one exchange.
// Partial sources are reduced at the destination (it receives every term of its region);
// Partial dims kept Partial on the same mesh keep their terms. The general fallback, and the
// only planner that crosses meshes.
#pragma once

#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

// Returns the single point_to_point step turning `from` into `to` (meshes may differ).
Step plan_point_to_point(const Layout& from, const Layout& to, const MachineModel& machine);

}  // namespace meshflow
