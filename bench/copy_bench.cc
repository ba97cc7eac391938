// copy_box against memcpy, interleaved.
#include "bench/copy_bench.h"

#include <cstring>

#include "meshflow/core/box.h"
#include "meshflow/core/random.h"

namespace meshflow::bench {

namespace {

// Copies a region of `row_bytes`-long rows that covers half the columns of its source, so the
// copy is strided (one memcpy per row) rather than one flat memcpy.
BenchResult copy_case(const std::string& name, std::int64_t region_bytes, std::int64_t row_bytes,
                      const CopyBenchOptions& options) {
  const std::int64_t cols = row_bytes / 4;
  const std::int64_t rows = std::max<std::int64_t>(1, region_bytes / row_bytes);
  Tensor src = random_tensor(DType::kFloat32, {rows, 2 * cols}, 1);
  Tensor dst(DType::kFloat32, {rows, cols});
  Tensor flat_src = random_tensor(DType::kFloat32, {rows, 2 * cols}, 2);
  const Box box{{0, cols / 2}, {rows, cols}};
  BenchResult r{.case_name = name,
                .backend = "host",
                .mesh = "",
                .devices = 1,
                .bytes = static_cast<std::int64_t>(dst.nbytes())};
  r.extra["row_bytes"] = row_bytes;
  r.baseline = "flat memcpy";
  const std::size_t run = static_cast<std::size_t>(row_bytes);
  const std::size_t src_row = 2 * run, skip = run / 2;
  // Floor: the same rows memcpy'd from where they live; baseline: one flat memcpy of the bytes.
  auto floor_fn = [&] {
    for (std::int64_t i = 0; i < rows; ++i) {
      std::memcpy(dst.bytes() + i * run, src.bytes() + i * src_row + skip, run);
    }
  };
  auto flat_fn = [&] { std::memcpy(dst.bytes(), flat_src.bytes(), dst.nbytes()); };
  for (int i = 0; i < options.warmup; ++i) flat_fn();
  for (int i = 0; i < options.reps; ++i) {
    r.case_s.push_back(time_once([&] { copy_box(src, box, dst, {0, 0}); }));
    r.floor_s.push_back(time_once(floor_fn));
    r.baseline_s.push_back(time_once(flat_fn));
  }
  return r;
}

}  // namespace

BenchReport run_copy_bench(const CopyBenchOptions& options) {
  BenchReport report{.benchmark = "copy", .progress = options.progress};
  const std::int64_t region = options.region_mib << 20;
  add_result(report, copy_case("copy_box long rows", region, 64 << 10, options));
  add_result(report, copy_case("copy_box 16 KiB rows", region, 16 << 10, options));
  add_result(report, copy_case("copy_box short rows", region, 64, options));
  report.memcpy_gbps = region / median(report.results[0].baseline_s) / 1e9;
  return report;
}

}  // namespace meshflow::bench
