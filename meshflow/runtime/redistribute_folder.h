// Redistributing a sharded folder on disk: every device reads its own shard, runs the plan and
// writes its new shard; the output folder appears complete or not at all.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

#include "meshflow/comm/launch.h"
#include "meshflow/plan/plan.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

struct RedistributeFolderOptions {
  std::filesystem::path in, out;
  std::vector<Placement> to;          // destination placements
  std::optional<DeviceMesh> to_mesh;  // default: the source mesh
  Backend backend = Backend::kThreads;
  PlanOptions plan;
  Timeout timeout = kDefaultTimeout;
  // Called by the device that reports (the leader) as each stage ends: "read the source shards",
  // "moved the data", "wrote the new shards".
  std::function<void(std::string_view stage)> progress;
};

struct RedistributeFolderResult {
  Plan plan;
  double seconds = 0;     // wall time of the plan's execution on device 0 of the source mesh
  bool reporter = false;  // true on the process that prints: the destination's first device
                          // under threads, device 0 under mpi
};

// Runs the redistribution. Throws Error for bad input (naming the file or value) before any
// output exists; under mpi a device that fails aborts the job and the output is not created.
RedistributeFolderResult redistribute_folder(const RedistributeFolderOptions& options);

}  // namespace meshflow
