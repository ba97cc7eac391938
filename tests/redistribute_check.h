// Redistribution checked against an independent reference: every device runs the plan on its
// seeded source shard; the destination shards are gathered and assembled (reducing Partial
// terms) and compared with the assembled source. Runs unchanged on threads and mpi.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/runtime/executor.h"

namespace meshflow::testing {

// Returns device `device`'s seeded source shard under `layout`: devices that agree on every
// non-Replicate mesh coordinate hold identical data (replicas agree, Partial terms differ).
Tensor source_shard(const Layout& layout, DeviceId device, std::uint64_t seed);

// Returns true when the contract (docs/contract.md) forbids `from` -> `to` (Shard -> Partial,
// Partial(a) -> Partial(b)).
bool forbidden(const Layout& from, const Layout& to);

// Runs and checks every pair on `world` (all devices of both meshes must be in it). Failures
// are reported through GoogleTest on device 0; returns the number of pairs checked.
int check_pairs(Communicator& world, const std::vector<std::pair<Layout, Layout>>& pairs,
                PlanCache& cache, std::uint64_t seed);

// Returns every ordered pair of placement lists over {R, S(0), S(1), P(sum), P(avg), P(max)}
// on `mesh` for a tensor of `shape` (P(avg) only for floating-point dtypes).
std::vector<std::pair<Layout, Layout>> all_pairs(const DeviceMesh& mesh, const Shape& shape,
                                                 DType dtype);

// Returns `meshflow bench plan`'s pairs (planned there on 16x16x16x16) on a mesh of the same
// rank, 2x2x2x2, with even and uneven shapes.
std::vector<std::pair<Layout, Layout>> large_mesh_pairs();

}  // namespace meshflow::testing
