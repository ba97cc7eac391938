// Redistribution on the threads backend: every ordered pair of placements on small meshes, random
// pairs on a 2x2x2 mesh, cross-mesh cases, and the invalid pairs' errors.
#include <gtest/gtest.h>

#include <random>

#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"
#include "tests/redistribute_check.h"

namespace meshflow {
namespace {

using testing::all_pairs;
using testing::check_pairs;

void run_pairs(int devices, const std::vector<std::pair<Layout, Layout>>& pairs,
               std::uint64_t seed) {
  PlanCache cache;
  launch({.backend = Backend::kThreads, .devices = first_devices(devices)},
         [&](Communicator& world) { check_pairs(world, pairs, cache, seed); });
}

struct MeshCase {
  std::string name;
  Shape mesh;
};

// Names the parameter in test listings (ctest shows it beside each test).
void PrintTo(const MeshCase& c, std::ostream* os) { *os << "mesh " << c.name; }

class ExhaustivePairs : public ::testing::TestWithParam<std::tuple<MeshCase, Shape>> {};

TEST_P(ExhaustivePairs, MatchGatherThenReshard) {
  const auto& [mesh_case, shape] = GetParam();
  DeviceMesh mesh = make_mesh(mesh_case.mesh);
  run_pairs(size(mesh), all_pairs(mesh, shape, DType::kFloat32), 7);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ExhaustivePairs,
    ::testing::Combine(::testing::Values(MeshCase{"4", {4}}, MeshCase{"2x2", {2, 2}},
                                         MeshCase{"2x3", {2, 3}}, MeshCase{"4x1", {4, 1}}),
                       ::testing::Values(Shape{8, 6}, Shape{5, 3}, Shape{1, 2}, Shape{0, 4})),
    [](const auto& p) {
      return "mesh" + std::get<0>(p.param).name + "_shape" + to_string(std::get<1>(p.param));
    });

TEST(RandomPairs, TwoThousandOnA2x2x2Mesh) {
  const std::uint64_t seed = 424242;
  std::mt19937_64 rng(seed);
  DeviceMesh mesh = make_mesh({2, 2, 2});
  const Shape shapes[] = {{8, 8}, {5, 3}, {16, 4}, {3, 9}, {0, 2}};
  std::vector<std::pair<Layout, Layout>> pairs;
  for (const Shape& shape : shapes) {
    auto all = all_pairs(mesh, shape, DType::kFloat32);
    std::shuffle(all.begin(), all.end(), rng);
    pairs.insert(pairs.end(), all.begin(), all.begin() + 400);
  }
  run_pairs(8, pairs, seed);
}

TEST(ExactPairs, IntegerPairsAreBitExact) {
  // Integer data makes every sum exact, and Replicate -> Partial(sum) keeps integers on the first
  // device along the dim (the others hold 0), so every pair must match the reference bit for bit.
  run_pairs(4, all_pairs(make_mesh({2, 2}), {7, 5}, DType::kInt64), 99);
  run_pairs(6, all_pairs(make_mesh({2, 3}), {5, 3}, DType::kInt32), 98);
}

TEST(ExactPairs, IntegerReplicateToPartialSumKeepsEveryValue) {
  // Regression: int64 [7,5,1,3,-9] replicated on 3 devices and moved to P(sum) gathered as
  // [6,3,0,3,-9] when each device divided its copy by 3.
  const Layout from = make_layout(make_mesh({3}), {Placement::replicate()}, {5}, DType::kInt64);
  const Layout to = make_layout(make_mesh({3}), {Placement::partial()}, {5}, DType::kInt64);
  const Plan plan = plan_redistribute(from, to);
  std::vector<Tensor> shards(3);
  launch({.backend = Backend::kThreads, .devices = first_devices(3)}, [&](Communicator& world) {
    Tensor x(DType::kInt64, {5});
    const std::int64_t values[] = {7, 5, 1, 3, -9};
    for (int i = 0; i < 5; ++i) x.data<std::int64_t>()[i] = values[i];
    shards[world.device()] = execute(lower(plan, world.device()), world, x);
  });
  const Tensor value = assemble(to, shards);
  const std::int64_t expected[] = {7, 5, 1, 3, -9};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(value.data<std::int64_t>()[i], expected[i]) << i;
  EXPECT_EQ(shards[1].data<std::int64_t>()[0], 0) << "devices after the first hold 0";
}

TEST(ExactPairs, IntegerPartialAvgIsRefusedNamingThePlacement) {
  try {
    make_layout(make_mesh({2}), {Placement::partial(ReduceOp::kAvg)}, {4}, DType::kInt32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"P(avg)\" needs a floating-point dtype"),
              std::string::npos)
        << e.what();
  }
}

Layout L(const char* mesh, const char* placements, Shape shape) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape),
                     DType::kFloat32);
}

TEST(CrossMesh, DifferentShapesDeviceSetsAndPartialSources) {
  std::vector<std::pair<Layout, Layout>> pairs = {
      {L("2x2", "S(0),S(1)", {8, 6}), L("4", "S(1)", {8, 6})},
      {L("2x2", "P(sum),S(0)", {8, 6}), L("4", "R", {8, 6})},
      {L("4", "S(0)", {9, 5}), L("2x2@4,5,6,7", "S(0),S(1)", {9, 5})},
      {L("4", "P(avg)", {9, 5}), L("2x2@4,5,6,7", "R,S(1)", {9, 5})},
      {L("2", "S(0)", {7, 3}), L("3@1,2,3", "S(0)", {7, 3})},
      {L("2", "P(max)", {7, 3}), L("3@1,2,3", "S(1)", {7, 3})},
      {L("2@6,7", "S(1)", {5, 5}), L("3@0,1,2", "P(sum)", {5, 5})},
      {L("2x2", "R,P(sum)", {4, 4}), L("2x2@3,2,1,0", "P(sum),R", {4, 4})},
  };
  run_pairs(8, pairs, 5);
}

// bench plan's pairs on their 16-device form: the plans execute to what gathering and
// resharding gives (under mpirun -n 16 too: redistribute_mpi_test).
TEST(LargeMeshPairs, ExecuteOnTheirSixteenDeviceForm) {
  run_pairs(16, testing::large_mesh_pairs(), 11);
}

TEST(MergedAllReduce, AvgAvgSumOfTheSameValueGivesTwiceIt) {
  // Every device holds the same x (small integers, so every sum is exact): the value of
  // [P(avg),P(avg),P(sum)] is avg(avg(x + x)) = 2x, reached with one all-reduce over all 8.
  const Layout from = L("2x2x2", "P(avg),P(avg),P(sum)", {6, 5});
  const Layout to = L("2x2x2", "R,R,R", {6, 5});
  Tensor x(DType::kFloat32, {6, 5});
  Tensor ints = random_tensor(DType::kInt32, {6, 5}, 3);
  for (int i = 0; i < 30; ++i)
    x.data<float>()[i] = static_cast<float>(ints.data<std::int32_t>()[i]);
  const Plan plan = plan_redistribute(from, to);
  ASSERT_EQ(plan.steps.size(), 1u) << to_text(plan);
  EXPECT_EQ(plan.steps[0].kind, StepKind::kAllReduce);
  EXPECT_EQ(plan.steps[0].mesh_dims, (std::vector<MeshDim>{0, 1, 2}));
  launch({.backend = Backend::kThreads, .devices = first_devices(8)}, [&](Communicator& world) {
    Tensor got = execute(lower(plan, world.device()), world, x);
    for (int i = 0; i < 30; ++i)
      ASSERT_EQ(got.data<float>()[i], 2 * x.data<float>()[i]) << "device " << world.device();
  });
}

TEST(InvalidPairs, ErrorsNameTheMeshDimAndPlacements) {
  auto message = [](const char* a, const char* b) {
    try {
      plan_redistribute(L("2x2", a, {4, 4}), L("2x2", b, {4, 4}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      message("S(0),R", "P(sum),R"),
      "cannot redistribute mesh dim 0 from S(0) to P(sum): a shard cannot become a partial term");
  EXPECT_EQ(message("R,P(sum)", "R,P(max)"),
            "cannot redistribute mesh dim 1 from P(sum) to P(max): partial ops differ");
  EXPECT_THROW(plan_redistribute(L("2x2", "R,R", {4, 4}), L("2x2", "R,R", {4, 5})), Error);
}

}  // namespace
}  // namespace meshflow
