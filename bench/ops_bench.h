// `meshflow bench ops`: the DTensor operator path on the threads backend.
//   dispatch        per-operator overhead (propagation and cached plan lookup, excluding the
//                   kernel and any data movement), on tiny operands; target 2 µs
//   gemm            a local GEMM through the DTensor path (x S(0) @ w R) against a bare
//                   cblas_sgemm of the same local shape (baseline cblas_sgemm)
//   elementwise     add of two S(0) tensors against a plain loop over the same local buffers
//                   (the memory-bandwidth floor)
//   tp_mlp_forward  a tensor-parallel MLP forward (batch 512, 1024 -> 4096 -> 1024, float32;
//                   column- then row-parallel linear, then the one reduction) on 1, 2 and 4
//                   devices, split into kernel_s, movement_s and overhead_s, against the same
//                   MLP computed on one thread without DTensors (baseline sequential)
#pragma once

#include <vector>

#include "bench/report.h"

namespace meshflow::bench {

struct OpsBenchOptions {
  bool progress = true;
  int devices = 4;  // device threads for dispatch, gemm and elementwise; tp_mlp runs 1, 2, 4
  int reps = 7;
  int warmup = 1;
};

BenchReport run_ops_bench(const OpsBenchOptions& options);

}  // namespace meshflow::bench
