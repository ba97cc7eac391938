// The cases of plan_bench.h.
#include "bench/plan_bench.h"

#include <fmt/format.h>

#include "bench/collectives_bench.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/plan/planner.h"

namespace meshflow::bench {

namespace {

struct Pair {
  std::string from, to, shape;
};

// Rank-4 meshes of 16, 4,096 and 65,536 devices.
const std::vector<std::string> kMeshes = {"2x2x2x2", "8x8x8x8", "16x16x16x16"};

// A partial sum and shards moving over every dim; two shards trading dims; a replicated
// tensor sharded over two dims and summed over a third.
const std::vector<Pair> kPairs = {
    {"S(0),P(sum),R,S(1)", "R,S(1),S(0),R", "4096x4096x64"},
    {"S(0),S(1),R,R", "R,R,S(1),S(0)", "4096x4096"},
    {"P(sum),R,R,S(0)", "S(0),S(1),P(sum),R", "4096x4096"},
};

}  // namespace

BenchReport run_plan_bench(const PlanBenchOptions& options) {
  BenchReport report{.benchmark = "plan", .progress = options.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  for (const Pair& pair : kPairs) {
    const Shape shape = parse_shape(pair.shape);
    std::vector<double> baseline;
    for (const std::string& mesh_text : kMeshes) {
      const DeviceMesh mesh = parse_mesh(mesh_text);
      const Layout from = make_layout(mesh, parse_placements(pair.from), shape, DType::kFloat32);
      const Layout to = make_layout(mesh, parse_placements(pair.to), shape, DType::kFloat32);
      Plan plan;
      BenchResult r{.case_name = fmt::format("{} -> {}", pair.from, pair.to),
                    .backend = "host",
                    .mesh = mesh_text,
                    .devices = static_cast<int>(size(mesh)),
                    .bytes = numel(shape) * 4};
      plan = plan_redistribute(from, to, {});  // warm: code and allocator, not a cache
      for (int i = 0; i < options.reps; ++i)
        r.case_s.push_back(time_once([&] { plan = plan_redistribute(from, to, {}); }));
      if (baseline.empty()) baseline = r.case_s;
      r.baseline = "16 devices";
      r.baseline_s = baseline;
      r.extra["steps"] = plan.steps.size();
      r.extra["est_s"] = plan.est_s;
      r.extra["shape"] = pair.shape;
      add_result(report, std::move(r));
    }
  }
  return report;
}

}  // namespace meshflow::bench
