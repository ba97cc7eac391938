// `meshflow bench copy`: copy_box of a large region against plain memcpy of the same bytes.
#pragma once

#include "bench/report.h"

namespace meshflow::bench {

struct CopyBenchOptions {
  bool progress = true;          // a line per finished case on a terminal
  std::int64_t region_mib = 64;  // bytes of the copied region
  int reps = 9;
  int warmup = 2;
};

// Returns the report: "copy_box long rows" (64 KiB rows), "copy_box 16 KiB rows" and
// "copy_box short rows" (64 B rows), each a region of half the columns of its source. The floor is
// memcpy of the same rows from where they live; the baseline is one flat memcpy of the same bytes
// (memcpy bandwidth), so 1 / vs_baseline is the fraction of memcpy bandwidth copy_box reaches. All
// three interleave.
BenchReport run_copy_bench(const CopyBenchOptions& options);

}  // namespace meshflow::bench
