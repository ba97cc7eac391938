// The placement problem of a real model against exhaustive enumeration of the same problem
// (with and without a memory limit that excludes the unconstrained optimum), and the search's
// choices priced by the compiler: a written file equals its own estimate, and the model's own
// placements are among the candidates.
#include "meshflow/auto/autoshard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshflow/auto/search_testing.h"
#include "meshflow/graph/model_file.h"

namespace meshflow {
namespace {

// The MLP of examples/models/dp_mlp.json on one mesh of `shape` (5 nodes, 6 sources).
Model mlp(const std::string& shape) {
  const std::string dir = MESHFLOW_EXAMPLES_DIR;
  const nlohmann::json j = {
      {"meshes", {{"m", shape}}},
      {"tensors",
       {{"x",
         {{"shape", {64, 32}}, {"input", dir + "/x.npy"}, {"mesh", "m"}, {"placements", {"R"}}}},
        {"y",
         {{"shape", {64}},
          {"dtype", "int64"},
          {"input", dir + "/y.npy"},
          {"mesh", "m"},
          {"placements", {"R"}}}},
        {"w1",
         {{"shape", {32, 64}},
          {"weight", {{"normal", 0.1}, {"seed", 1}}},
          {"mesh", "m"},
          {"placements", {"R"}}}},
        {"b1",
         {{"shape", {64}}, {"weight", {{"zeros", true}}}, {"mesh", "m"}, {"placements", {"R"}}}},
        {"w2",
         {{"shape", {64, 10}},
          {"weight", {{"normal", 0.1}, {"seed", 2}}},
          {"mesh", "m"},
          {"placements", {"R"}}}}}},
      {"nodes",
       {{{"name", "h"}, {"op", "linear"}, {"inputs", {"x", "w1", "b1"}}},
        {{"name", "a"}, {"op", "gelu"}, {"inputs", {"h"}}},
        {{"name", "o"}, {"op", "matmul"}, {"inputs", {"a", "w2"}}},
        {{"name", "loss"}, {"op", "softmax_cross_entropy"}, {"inputs", {"o", "y"}}}}},
      {"loss", "loss"},
      {"outputs", {"loss"}}};
  return parse_model(j.dump(), ".", "mlp");
}

using testing::exhaustive;

TEST(Autoshard, ModelProblemEqualsExhaustiveEnumeration) {
  const std::vector<int> zeros = {0, 1, 3};
  for (const std::string shape : {"2", "3"}) {
    const Model m = mlp(shape);
    const AutoshardOptions options{.update = {.kind = OptimizerKind::kAdamW}};
    SearchCache cache(options.plan);
    const std::vector<PlacementProblem> problems =
        placement_problems(m.pcg, zeros, 1, options, cache);
    ASSERT_EQ(problems.size(), zeros.size());
    for (std::size_t z = 0; z < zeros.size(); ++z) {
      SCOPED_TRACE("mesh " + shape + ", zero " + std::to_string(zeros[z]));
      const PlacementProblem& p = problems[z];
      ASSERT_EQ(p.problem.variables.size(), 4u);  // the compute nodes; every source is private
      const testing::Exhaustive free = exhaustive(p.problem, {});
      const std::optional<SearchResult> got = solve(p.problem);
      ASSERT_TRUE(got.has_value());
      EXPECT_NEAR(got->seconds, free.seconds, 1e-12);
      // A limit below the optimum's bytes: the constrained optimum, or nothing.
      const std::int64_t limit = free.bytes - 1;
      const testing::Exhaustive constrained = exhaustive(p.problem, {.memory_limit = limit});
      const std::optional<SearchResult> under = solve(p.problem, {.memory_limit = limit});
      ASSERT_EQ(under.has_value(), constrained.found);
      if (under) {
        EXPECT_NEAR(under->seconds, constrained.seconds, 1e-12);
        EXPECT_LE(under->bytes, limit);
        EXPECT_GT(under->seconds, free.seconds);
      }
    }
  }
}

TEST(Autoshard, ChoicePricedByTheCompilerAndNoWorseThanTheModelsOwn) {
  const auto dir = std::filesystem::temp_directory_path() / "meshflow_autoshard_test";
  std::filesystem::create_directories(dir);
  const std::string dp = std::string(MESHFLOW_EXAMPLES_DIR) + "/dp_mlp.json";
  const AutoshardResult r = autoshard(dp, {}, dir);
  ASSERT_TRUE(r.given_est_step_s.has_value());
  EXPECT_LE(r.est_step_s, *r.given_est_step_s);
  // The written file, read back from where it was written, prices the same.
  { std::ofstream(dir / "auto.json") << r.model.dump(); }
  const Model back = load_model(dir / "auto.json");
  const AutoshardResult again =
      autoshard(dir / "auto.json", {.zero = r.zero, .micro_batches = r.micro_batches}, dir);
  ASSERT_TRUE(again.given_est_step_s.has_value());
  EXPECT_DOUBLE_EQ(*again.given_est_step_s, r.est_step_s);
  EXPECT_EQ(back.train["zero"], r.zero);
  std::filesystem::remove_all(dir);
}

TEST(Autoshard, NothingFitsNamesTheLeastMemory) {
  const std::string dp = std::string(MESHFLOW_EXAMPLES_DIR) + "/dp_mlp.json";
  try {
    autoshard(dp, {.memory_limit = 1000}, ".");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-limit 1000 bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the least any choice needs is"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshflow
