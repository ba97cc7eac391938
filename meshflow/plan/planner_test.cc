#include "meshflow/plan/planner.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "meshflow/core/error.h"
#include "meshflow/core/golden.h"
#include "meshflow/plan/lower.h"
#include "meshflow/plan/point_to_point.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {
namespace {

Layout L(const char* mesh, const char* placements, Shape shape, DType dtype = DType::kFloat32) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape), dtype);
}

std::vector<StepKind> kinds(const Plan& p) {
  std::vector<StepKind> out;
  for (const Step& s : p.steps) out.push_back(s.kind);
  return out;
}

TEST(MergedCollectives, PartialDimsReduceInOneAllReduce) {
  for (const char* from : {"P(sum),R,P(sum)", "P(sum),P(sum),P(sum)", "P(avg),P(avg),P(sum)"}) {
    Plan p = plan_redistribute(L("2x2x2", from, {16, 16, 16}), L("2x2x2", "R,R,R", {16, 16, 16}));
    ASSERT_EQ(kinds(p), std::vector<StepKind>{StepKind::kAllReduce}) << from << "\n" << to_text(p);
    std::vector<MeshDim> partial;
    for (MeshDim m = 0; m < 3; ++m) {
      if (p.from.placements[m].is_partial()) partial.push_back(m);
    }
    EXPECT_EQ(p.steps[0].mesh_dims, partial);
  }
  Plan p = plan_redistribute(L("2x2x2", "P(sum),R,P(sum)", {16, 16, 16}),
                             L("2x2x2", "R,R,R", {16, 16, 16}));
  EXPECT_EQ(p.steps[0].mesh_dims, (std::vector<MeshDim>{0, 2}));
}

TEST(MergedCollectives, NestedShardsGatherInOneAllGatherOnlyWhenEven) {
  Plan even =
      plan_redistribute(L("2x2x2", "S(0),S(0),S(0)", {16, 4}), L("2x2x2", "R,R,R", {16, 4}));
  EXPECT_EQ(kinds(even), std::vector<StepKind>{StepKind::kAllGather}) << to_text(even);
  EXPECT_EQ(even.steps[0].mesh_dims, (std::vector<MeshDim>{0, 1, 2}));
  // 13 rows do not divide by 8: no merged all-gather, but still a correct plan (checked by the
  // redistribute tests) — DTensor's merged plan loses rows here.
  Plan uneven =
      plan_redistribute(L("2x2x2", "S(0),S(0),S(0)", {13, 4}), L("2x2x2", "R,R,R", {13, 4}));
  for (const Step& s : uneven.steps) {
    if (s.kind == StepKind::kAllGather) {
      EXPECT_EQ(s.mesh_dims.size(), 1u) << to_text(uneven);
    }
  }
  Plan dtensor_bug = plan_redistribute(L("2x2", "S(0),S(0)", {5, 3}), L("2x2", "R,R", {5, 3}));
  for (const Step& s : dtensor_bug.steps) {
    if (s.kind == StepKind::kAllGather) {
      EXPECT_EQ(s.mesh_dims.size(), 1u) << to_text(dtensor_bug);
    }
  }
}

TEST(MergedCollectives, AllToAllIsNeverMerged) {
  Plan p = plan_redistribute(L("2x2", "S(0),S(0)", {8, 8}), L("2x2", "S(1),S(1)", {8, 8}));
  for (const Step& s : p.steps) {
    if (s.kind == StepKind::kAllToAll) {
      EXPECT_EQ(s.mesh_dims.size(), 1u);
    }
  }
}

TEST(PerDim, FollowsDTensorsTransitionTable) {
  const MachineModel& m = default_machine();
  auto one = [&](const char* a, const char* b) {
    auto steps = plan_per_dim(L("4", a, {8, 8}), L("4", b, {8, 8}), m);
    EXPECT_EQ(steps.size(), 1u) << a << " -> " << b;
    return steps.empty() ? StepKind::kLocal : steps[0].kind;
  };
  EXPECT_EQ(one("S(0)", "R"), StepKind::kAllGather);
  EXPECT_EQ(one("P(sum)", "R"), StepKind::kAllReduce);
  EXPECT_EQ(one("P(sum)", "S(0)"), StepKind::kReduceScatter);
  EXPECT_EQ(one("S(0)", "S(1)"), StepKind::kAllToAll);
  EXPECT_EQ(one("R", "S(1)"), StepKind::kLocal);
  EXPECT_EQ(one("R", "P(avg)"), StepKind::kLocal);
  EXPECT_TRUE(plan_per_dim(L("4x1", "S(0),S(0)", {8, 8}), L("4x1", "S(0),R", {8, 8}), m).empty())
      << "a step on a mesh dim of size 1 is skipped";
}

TEST(Planner, ForbiddenTransitionsAreErrors) {
  EXPECT_THROW(plan_redistribute(L("4", "S(0)", {8}), L("4", "P(sum)", {8})), Error);
  EXPECT_THROW(plan_redistribute(L("4", "P(sum)", {8}), L("4", "P(avg)", {8})), Error);
  EXPECT_THROW(plan_redistribute(L("4", "R", {8}), L("4", "R", {8}, DType::kFloat64)), Error);
}

TEST(Planner, CrossMeshUsesPointToPointAndMovesOnlyWhatIsMissing) {
  Plan p = plan_redistribute(L("2x2", "S(0),S(1)", {8, 8}), L("4", "S(0)", {8, 8}));
  EXPECT_EQ(p.planner, "point_to_point");
  EXPECT_EQ(p.total_bytes, p.min_bytes) << to_text(p);
  Plan disjoint = plan_redistribute(L("4", "S(0)", {8, 8}), L("2x2@4,5,6,7", "S(0),S(1)", {8, 8}));
  EXPECT_EQ(disjoint.total_bytes, 8 * 8 * 4) << "every byte moves exactly once";
}

TEST(Planner, IsDeterministic) {
  Layout a = L("2x2x2", "S(0),P(sum),S(1)", {9, 10}), b = L("2x2x2", "R,S(0),R", {9, 10});
  EXPECT_EQ(to_text(plan_redistribute(a, b)), to_text(plan_redistribute(a, b)));
}

// Property: the chosen plan is never costlier than any candidate and never moves fewer bytes
// than the lower bound; every candidate stays at or above the bound too.
TEST(Planner, ChosenPlanIsCheapestAndRespectsTheLowerBound) {
  const unsigned seed = 77;
  std::mt19937 rng(seed);
  const std::vector<std::string> options = {"R", "S(0)", "S(1)", "P(sum)", "P(avg)", "P(max)"};
  const std::vector<Shape> meshes = {{4}, {2, 2}, {2, 3}, {2, 2, 2}};
  int planned = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const Shape& ms = meshes[rng() % meshes.size()];
    std::string a, b;
    for (std::size_t m = 0; m < ms.size(); ++m) {
      a += (m ? "," : "") + options[rng() % options.size()];
      b += (m ? "," : "") + options[rng() % options.size()];
    }
    Shape shape{static_cast<std::int64_t>(rng() % 12), static_cast<std::int64_t>(1 + rng() % 9)};
    Layout from = make_layout(make_mesh(ms), parse_placements(a), shape);
    Layout to = make_layout(make_mesh(ms), parse_placements(b), shape);
    SCOPED_TRACE(
        fmt::format("seed {} trial {}: {} -> {}", seed, trial, to_string(from), to_string(to)));
    Plan p;
    try {
      p = plan_redistribute(from, to);
    } catch (const Error&) {
      continue;
    }
    ++planned;
    EXPECT_GE(p.total_bytes, p.min_bytes);
    for (const Alternative& alt : p.alternatives) {
      EXPECT_LE(p.est_s, alt.est_s * (1 + 1e-9)) << alt.planner;
      EXPECT_GE(alt.total_bytes, p.min_bytes) << alt.planner;
    }
  }
  EXPECT_GT(planned, 300);
}

// Golden text: each line of a cases file is "MESH | SHAPE | FROM | TO | TO_MESH | DTYPE" (the
// last two optional); the plans' text forms (and, for program_cases.txt, every device's lowered
// program after its plan) must equal the golden file. After an intended change, regenerate it
// with `meshflow plan` (`--devices` for programs: the same text) and review the diff by hand.
std::string golden_text(const std::string& cases_file, bool programs) {
  std::ifstream cases(cases_file);
  EXPECT_TRUE(cases) << cases_file;
  std::string line, got;
  while (std::getline(cases, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::size_t pos = 0;
    while (true) {
      std::size_t bar = line.find('|', pos);
      std::string part = line.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos);
      part.erase(0, part.find_first_not_of(' '));
      part.erase(part.find_last_not_of(' ') + 1);
      f.push_back(part);
      if (bar == std::string::npos) break;
      pos = bar + 1;
    }
    EXPECT_GE(f.size(), 4u) << line;
    const Shape shape = parse_shape(f[1]);
    const DType dtype = f.size() > 5 ? parse_dtype(f[5]) : DType::kFloat32;
    Layout from = make_layout(parse_mesh(f[0]), parse_placements(f[2]), shape, dtype);
    Layout to = make_layout(parse_mesh(f.size() > 4 && !f[4].empty() ? f[4] : f[0]),
                            parse_placements(f[3]), shape, dtype);
    const Plan plan = plan_redistribute(from, to);
    got += to_text(plan);
    if (programs) {
      for (DeviceId d : plan_devices(plan)) got += to_text(lower(plan, d));
    }
    got += "\n";
  }
  return got;
}

// Compares `got` with testdata/<name>.txt (core/golden.h).
void expect_golden(const std::string& got, const std::string& name) {
  EXPECT_EQ(golden_mismatch(got, std::string(MESHFLOW_PLAN_TESTDATA) + "/" + name + ".txt",
                            name + ".actual.txt"),
            "");
}

TEST(Golden, PlanTextMatchesTheGoldenFile) {
  expect_golden(golden_text(std::string(MESHFLOW_PLAN_TESTDATA) + "/plan_cases.txt",
                            /*programs=*/false),
                "plan_golden");
}

TEST(Golden, DeviceProgramsMatchTheGoldenFile) {
  expect_golden(golden_text(std::string(MESHFLOW_PLAN_TESTDATA) + "/program_cases.txt",
                            /*programs=*/true),
                "program_golden");
}

// The totals over devices are summed by classes of devices (transitions.cc, sizes_histogram);
// device by device, from every device's shard boxes, they are the same: random layouts on
// meshes whose dims do or do not divide the shapes (uneven and empty shards), the winning plan's
// steps and the least bytes.
TEST(PlanTotals, SummedByClassesOfDevicesAsDeviceByDevice) {
  std::mt19937 rng(7);
  // Uneven shapes, and even ones (every shard equal: counted without enumeration, where one
  // layout's sharding of a dim refines the other's).
  const std::vector<std::string> meshes = {"3x2", "2x3x2", "4x1x3", "5", "2x2x2", "2x4"};
  const std::vector<Shape> shapes = {{5, 7, 3}, {2, 9, 4}, {6, 1, 11}, {8, 4, 16}, {16, 8, 8}};
  auto random_placements = [&](std::size_t k) {
    std::vector<Placement> p;
    for (std::size_t m = 0; m < k; ++m) {
      const int pick = static_cast<int>(rng() % 5);
      p.push_back(pick == 0   ? Placement::replicate()
                  : pick == 1 ? Placement::partial()
                              : Placement::shard(pick - 2));
    }
    return p;
  };
  int plans = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const DeviceMesh mesh = parse_mesh(meshes[static_cast<std::size_t>(trial) % meshes.size()]);
    const Shape& shape = shapes[static_cast<std::size_t>(trial) % shapes.size()];
    const std::size_t k = mesh.shape.size();
    const Layout from = make_layout(mesh, random_placements(k), shape, DType::kFloat32);
    std::vector<Placement> to_p = random_placements(k);
    for (Placement& p : to_p)
      if (p.is_partial()) p = Placement::replicate();  // a Partial target needs a Partial source
    const Layout to = make_layout(mesh, to_p, shape, DType::kFloat32);
    const Plan plan = plan_redistribute(from, to);
    ++plans;
    std::int64_t total = 0;
    for (const Step& s : plan.steps) {
      const Layout before = with_placements(from, s.before), after = with_placements(from, s.after);
      std::int64_t n = 1;
      for (MeshDim m : s.mesh_dims) n *= mesh.shape[m];
      std::int64_t want = 0;
      if (s.kind == StepKind::kPointToPoint) {  // the transfers listed one by one
        for (const Transfer& t : point_to_point_transfers(from, to))
          want += t.src == t.dst ? 0 : numel(t.box) * 4;
      }
      for (int i = 0; i < size(mesh); ++i) {
        const std::vector<std::int64_t> c = coordinates_at(mesh, i);
        const Box b = shard_box_at(before, c), a = shard_box_at(after, c);
        switch (s.kind) {
          case StepKind::kAllGather:
            want += (numel(a) - numel(b)) * 4;
            break;
          case StepKind::kReduceScatter:
            want += (n - 1) * numel(a) * 4;
            break;
          case StepKind::kAllReduce:
            want += 2 * (n - 1) * numel(b) / n * 4;
            break;
          case StepKind::kAllToAll:
            want += (numel(a) - numel(intersect(a, b))) * 4;
            break;
          default:
            break;
        }
      }
      EXPECT_EQ(s.total_bytes, want) << to_text(plan);
      total += want;
    }
    EXPECT_EQ(plan.total_bytes, total) << to_text(plan);
    std::int64_t terms = 1;
    for (MeshDim m : reduced_partial_dims(from, to)) terms *= mesh.shape[m];
    std::int64_t least = 0;
    for (int i = 0; i < size(mesh); ++i) {
      const std::vector<std::int64_t> c = coordinates_at(mesh, i);
      const Box want = shard_box_at(to, c);
      least += terms > 1 ? numel(want) * (terms - 1) / terms * 4
                         : (numel(want) - numel(intersect(want, shard_box_at(from, c)))) * 4;
    }
    EXPECT_EQ(plan.min_bytes, least) << to_text(plan);
  }
  EXPECT_EQ(plans, 150);
}

// plan --json lists every step's devices up to 4,096 of them; above, "devices" is null and the
// groups are the step's mesh dims ("group_shape").
TEST(PlanJson, DevicesListedUpTo4096AndGroupShapesAlways) {
  for (const char* text : {"8x8x8x8", "16x16x16x16"}) {
    const DeviceMesh mesh = parse_mesh(text);
    const Shape shape{4096, 4096};
    const Plan plan = plan_redistribute(
        make_layout(mesh, parse_placements("S(0),S(1),R,R"), shape, DType::kFloat32),
        make_layout(mesh, parse_placements("R,R,S(1),S(0)"), shape, DType::kFloat32));
    const nlohmann::json j = to_json(plan);
    ASSERT_FALSE(j["steps"].empty());
    for (const nlohmann::json& s : j["steps"]) {
      std::vector<std::int64_t> group;
      for (int m : s["mesh_dims"]) group.push_back(mesh.shape[static_cast<std::size_t>(m)]);
      EXPECT_EQ(s["group_shape"], group);
      if (size(mesh) <= kPlanJsonMaxDevices) {
        EXPECT_EQ(s["devices"].size(), static_cast<std::size_t>(size(mesh)));
      } else {
        EXPECT_TRUE(s["devices"].is_null());
      }
    }
  }
}

}  // namespace
}  // namespace meshflow
