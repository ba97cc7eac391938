// `meshflow bench plan`: the planner's cold time (no cache, nothing printed) for fixed layout
// pairs on meshes of 16, 4,096 and 65,536 devices, each against the same pair on 16 devices
// (baseline "16 devices", timed first in the same run): how planning grows with the cluster. Each
// result adds `steps` and `est_s`, the chosen plan's.
#pragma once

#include "bench/report.h"

namespace meshflow::bench {

struct PlanBenchOptions {
  bool progress = true;  // a line per finished case on a terminal
  int reps = 5;
};

BenchReport run_plan_bench(const PlanBenchOptions& options);

}  // namespace meshflow::bench
