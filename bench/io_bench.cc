// The I/O benchmark. Peak memory of meshflow's own case is the process's VmHWM after resetting
// it (writing 5 to /proc/self/clear_refs) just before the case; NumPy's is its process's
// ru_maxrss. Times exclude process start-up on both sides.
#include "bench/io_bench.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/collectives_bench.h"
#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/folder_io.h"

namespace meshflow::bench {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kCols = 1024;

// The NumPy side: shard (2x2, S(0),S(1), the chunk rule) or gather, timed inside Python.
constexpr const char* kNumpyScript = R"(
import json, os, resource, sys, time
import numpy as np
mode, src, dst = sys.argv[1:4]
start = time.perf_counter()
if mode == "shard":
    x = np.load(src)
    os.makedirs(dst, exist_ok=True)
    cr, cc = -(-x.shape[0] // 2), -(-x.shape[1] // 2)
    for i, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        np.save(f"{dst}/rank{i}.npy", x[a * cr:(a + 1) * cr, b * cc:(b + 1) * cc])
else:
    parts = [np.load(f"{src}/rank{i}.npy") for i in range(4)]
    x = np.empty((parts[0].shape[0] + parts[2].shape[0], parts[0].shape[1] + parts[1].shape[1]), parts[0].dtype)
    r0, c0 = parts[0].shape
    x[:r0, :c0], x[:r0, c0:], x[r0:, :c0], x[r0:, c0:] = parts
    np.save(dst, x)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
)";

std::int64_t peak_bytes() { return status_bytes("VmHWM:"); }

struct Measured {
  double seconds;
  std::int64_t peak;
};

Measured measure(const std::function<void()>& fn) {
  reset_peak_memory();
  const double s = time_once(fn);
  return {s, peak_bytes()};
}

// Runs the NumPy script; nullopt when it cannot run (no python3 or no NumPy).
std::optional<Measured> numpy_run(const fs::path& python, const fs::path& script,
                                  const std::string& mode, const fs::path& src,
                                  const fs::path& dst) {
  const std::optional<nlohmann::json> j =
      run_command({python.string(), script.string(), mode, src.string(), dst.string()}).json();
  if (!j || !j->is_object() || !j->contains("seconds")) return std::nullopt;
  return Measured{(*j)["seconds"].get<double>(), (*j)["peak_bytes"].get<std::int64_t>()};
}

}  // namespace

BenchReport run_io_bench(const IoBenchOptions& options) {
  BenchReport report{.benchmark = "io", .progress = options.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const fs::path dir = (options.dir.empty() ? fs::temp_directory_path() : options.dir) /
                       fmt::format("meshflow-bench-io-{}", ::getpid());
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{dir};
  const Shape shape{std::max<std::int64_t>(1, options.bytes / 4 / kCols), kCols};
  const std::int64_t bytes = numel(shape) * 4;
  write_npy(dir / "x.npy", random_tensor(DType::kFloat32, shape, 1));
  std::ofstream(dir / "baseline.py") << kNumpyScript;
  const DeviceMesh mesh = make_mesh({2, 2});
  const auto placements = parse_placements("S(0),S(1)");
  BenchResult shard{
      .case_name = "shard", .backend = "host", .mesh = "2x2", .devices = 4, .bytes = bytes};
  BenchResult gather{
      .case_name = "gather", .backend = "host", .mesh = "2x2", .devices = 4, .bytes = bytes};
  std::int64_t peak[2] = {0, 0}, baseline_peak[2] = {0, 0};
  bool have_numpy = true;
  for (int i = 0; i < options.reps; ++i) {
    const Measured s = measure([&] { shard_file(dir / "x.npy", mesh, placements, dir / "ours"); });
    shard.case_s.push_back(s.seconds);
    peak[0] = std::max(peak[0], s.peak);
    const Measured g = measure([&] { gather_file(dir / "ours", dir / "ours.npy"); });
    gather.case_s.push_back(g.seconds);
    peak[1] = std::max(peak[1], g.peak);
    if (!have_numpy) continue;
    const auto ns =
        numpy_run(options.python, dir / "baseline.py", "shard", dir / "x.npy", dir / "theirs");
    const auto ng = numpy_run(options.python, dir / "baseline.py", "gather", dir / "theirs",
                              dir / "theirs.npy");
    if (!ns || !ng) {
      have_numpy = false;
      continue;
    }
    shard.baseline_s.push_back(ns->seconds);
    gather.baseline_s.push_back(ng->seconds);
    baseline_peak[0] = std::max(baseline_peak[0], ns->peak);
    baseline_peak[1] = std::max(baseline_peak[1], ng->peak);
  }
  BenchResult* results[2] = {&shard, &gather};
  for (int k = 0; k < 2; ++k) {
    BenchResult& r = *results[k];
    r.extra["peak_bytes"] = peak[k];
    r.extra["peak_vs_tensor"] = static_cast<double>(peak[k]) / static_cast<double>(bytes);
    if (have_numpy) {
      r.baseline = "numpy";
      r.extra["baseline_peak_bytes"] = baseline_peak[k];
    } else {
      r.baseline_s.clear();
    }
    add_result(report, r);
  }
  return report;
}

}  // namespace meshflow::bench
