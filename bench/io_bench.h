// `meshflow bench io`: `meshflow shard` and `meshflow gather` of one large .npy file (a 2x2
// mesh, placements S(0),S(1)), against NumPy doing the same with np.load, slicing and np.save
// (baseline "numpy", run alternately in the same session when Debian's /usr/bin/python3 with
// NumPy is present). Each result adds peak_bytes (the process's peak resident memory during the
// case), baseline_peak_bytes and peak_vs_tensor (peak_bytes over the tensor's bytes).
#pragma once

#include <filesystem>

#include "bench/report.h"

namespace meshflow::bench {

struct IoBenchOptions {
  bool progress = true;                          // a line per finished case on a terminal
  std::int64_t bytes = std::int64_t{512} << 20;  // of the float32 tensor
  int reps = 3;
  std::filesystem::path dir;  // where the files go (default: the system's temporary folder)
  std::filesystem::path python = "/usr/bin/python3";
};

BenchReport run_io_bench(const IoBenchOptions& options);

}  // namespace meshflow::bench
