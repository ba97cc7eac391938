// `meshflow bench data`: the data loader alone.
//   read  one device's shard boxes of a step (tokens and next tokens, [B, S] int64 windows with
//         shifts 0 and 1, sequential order) from a uint16 token stream of `stream_bytes` whose
//         pages were touched beforehand, step after step through the stream; floor: memcpy of
//         the same source and destination bytes between buffers of their sizes, interleaved
//         rep by rep (DESIGN's bench contract)
#pragma once

#include <cstdint>
#include <filesystem>

#include "bench/report.h"

namespace meshflow::bench {

struct DataBenchOptions {
  bool progress = true;
  int reps = 50;
  std::int64_t batch = 64, seq = 1024;
  std::int64_t stream_bytes = std::int64_t{2} << 30;
  std::filesystem::path dir;  // where the stream goes (default: the temporary folder)
};

BenchReport run_data_bench(const DataBenchOptions& options);

}  // namespace meshflow::bench
