// `meshflow bench collectives`: every collective at each size, against its floor (threads: the
// same bytes moved by plain memcpy in the same pattern on the same threads) or its baseline (mpi:
// the same raw MPI call), interleaved in one run.
#pragma once

#include <vector>

#include "bench/report.h"
#include "meshflow/comm/launch.h"

namespace meshflow::bench {

struct CollectivesBenchOptions {
  bool progress = true;  // a line per finished case on a terminal
  Backend backend = Backend::kThreads;
  int devices = 4;                       // threads: device threads; mpi: 0 = the world
  std::vector<std::int64_t> sizes;       // global (gathered) bytes per case
  std::vector<std::string> collectives;  // empty = all
  int reps = 7;
  int warmup = 2;
};

// Returns the names `collectives` accepts: all_gather, all_reduce, reduce_scatter, all_to_all,
// broadcast, collective_permute.
const std::vector<std::string>& collective_names();

// Runs the benchmark. Under mpi every rank takes part; the returned report is complete on
// device 0 only (`printer` is true there), and the caller prints only where it is true.
BenchReport run_collectives_bench(const CollectivesBenchOptions& options, bool* printer);

// Returns bytes parsed from "4K", "16M", "1G" or a plain number; throws Error naming `text`.
std::int64_t parse_bytes(std::string_view text);

// Returns the seconds one memcpy of `bytes` takes here (median of a few).
double measure_memcpy_seconds(std::int64_t bytes);

// Returns this machine's memcpy bandwidth in GB/s, measured now (a report's memcpy_gbps).
double measured_memcpy_gbps();

// Returns the launch options of a distributed benchmark: `devices` device threads (threads) or
// devices of the world (mpi, 0 = all), with a timeout long enough for the largest cases.
LaunchOptions bench_launch_options(Backend backend, int devices);

}  // namespace meshflow::bench
