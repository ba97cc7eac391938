// `meshflow bench overlap`: the decomposed collective matmuls (runtime/overlap.h) against the
// sequential collective then GEMM, threads or mpi. x has `bytes` of float32 as [M, 512] and w is
// [512, 512]. Cases, each with baseline `sequential`:
//   allgather_gemm_permute    x row-sharded, all-gather decomposed into n - 1 permutes
//   allgather_gemm_broadcast  the same as n broadcasts
//   allgather_gemm_in_place   (threads, devices sharing memory) every block multiplied where it
//                             lies, nothing copied
//   gemm_reduce_scatter       x and w sharded on K, the sum reduce-scattered by rows as a ring
// with comm_s and gemm_s (the collective and the GEMM timed alone) and overlap_efficiency =
// (t_sequential - t_overlapped) / min(t_comm, t_gemm). With `simulate` nothing runs: each case
// is the cost model's timeline (plan/cost_model.h) on that machine, links and compute
// independent, for a group of `devices` (backend "simulated"; devices that do not share memory,
// so without the in-place case).
#pragma once

#include <vector>

#include "bench/report.h"
#include "meshflow/comm/launch.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::bench {

struct OverlapBenchOptions {
  bool progress = true;
  Backend backend = Backend::kThreads;
  int devices = 2;                  // threads: device threads; mpi: 0 = the world
  std::vector<std::int64_t> sizes;  // bytes of x
  std::vector<std::string> cases;   // empty = every case the backend runs
  int reps = 7;
  int warmup = 1;
  const MachineModel* simulate = nullptr;
};

// Runs the benchmark; the report is complete on device 0 only (`printer` is true there).
BenchReport run_overlap_bench(const OverlapBenchOptions& options, bool* printer);

}  // namespace meshflow::bench
