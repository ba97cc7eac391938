// `meshflow bench redistribute`: S(0)->R, S(0)->S(1), P(sum)->S(0) and P(sum)->R on a 1-d mesh
// against their memcpy floors (the same bytes moved in the same pattern on the same threads,
// interleaved; under mpi, against the raw MPI collective doing the same work), plus planning times:
// a cached plan, a fresh plan on a 3-d mesh, and a fresh plan for a 16x16x16 mesh (4096 devices,
// planning only).
#pragma once

#include <vector>

#include "bench/report.h"
#include "meshflow/comm/launch.h"

namespace meshflow::bench {

struct RedistributeBenchOptions {
  bool progress = true;  // a line per finished case on a terminal
  Backend backend = Backend::kThreads;
  int devices = 4;
  std::vector<std::int64_t> sizes;  // global tensor bytes (float32)
  std::vector<std::string> cases;   // empty = all
  int reps = 7;
  int warmup = 2;
};

// Returns the names `cases` accepts.
const std::vector<std::string>& redistribute_case_names();

// Runs the benchmark; `printer` is set where the report is complete (see collectives_bench.h).
BenchReport run_redistribute_bench(const RedistributeBenchOptions& options, bool* printer);

}  // namespace meshflow::bench
