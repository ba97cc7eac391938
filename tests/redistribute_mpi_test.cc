// Redistribution on the mpi backend (run under mpirun -n 4, and MpiLargeMesh under -n 16): a
// representative subset of the threads suite, checked the same way.
#include <gtest/gtest.h>

#include <random>

#include "meshflow/comm/launch.h"
#include "tests/redistribute_check.h"

namespace meshflow {
namespace {

void run_pairs(const std::vector<std::pair<Layout, Layout>>& pairs, std::uint64_t seed) {
  PlanCache cache;
  launch({.backend = Backend::kMpi},
         [&](Communicator& world) { testing::check_pairs(world, pairs, cache, seed); });
}

Layout L(const char* mesh, const char* placements, Shape shape) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape),
                     DType::kFloat32);
}

TEST(MpiRedistribute, SampledPairsOn2x2) {
  std::mt19937_64 rng(11);
  std::vector<std::pair<Layout, Layout>> pairs;
  for (const Shape& shape : {Shape{8, 6}, Shape{5, 3}}) {
    auto all = testing::all_pairs(make_mesh({2, 2}), shape, DType::kFloat32);
    std::shuffle(all.begin(), all.end(), rng);
    pairs.insert(pairs.end(), all.begin(), all.begin() + 150);
  }
  run_pairs(pairs, 11);
}

TEST(MpiRedistribute, CrossMesh) {
  run_pairs({{L("2x2", "S(0),S(1)", {8, 6}), L("4", "S(1)", {8, 6})},
             {L("2@0,1", "P(sum)", {7, 3}), L("2@2,3", "S(0)", {7, 3})},
             {L("2", "S(0)", {7, 3}), L("3@1,2,3", "S(0)", {7, 3})}},
            12);
}

// Run alone under mpirun -n 16 (ctest redistribute_mpi_16ranks): bench plan's pairs on
// 2x2x2x2, one process per device.
TEST(MpiLargeMesh, BenchPlanPairsOn2x2x2x2) { run_pairs(testing::large_mesh_pairs(), 13); }

}  // namespace
}  // namespace meshflow
