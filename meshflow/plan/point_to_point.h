// The point-to-point planner: each destination device receives exactly the regions of its
// destination shard it does not hold, from source devices that hold them, in one exchange.
// Partial sources are reduced at the destination (it receives every term of its region);
// Partial dims kept Partial on the same mesh keep their terms. The general fallback, and the
// only planner that crosses meshes.
#pragma once

#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

// Returns the single point_to_point step turning `from` into `to` (meshes may differ), priced
// in closed form: on one mesh by classes of devices (sizes_histogram), across meshes by one
// visit per destination; no transfer is built.
Step plan_point_to_point(const Layout& from, const Layout& to, const MachineModel& machine);

// Returns every transfer of that step, by destination position, source class, then term (a
// device's piece of its own shard included, src == dst).
std::vector<Transfer> point_to_point_transfers(const Layout& from, const Layout& to);

// Returns the transfers of that step that device `me` sends or receives (its own piece once),
// in work proportional to the meshes' devices: what a backend needs to execute it.
std::vector<Transfer> device_transfers(const Layout& from, const Layout& to, DeviceId me);

}  // namespace meshflow
