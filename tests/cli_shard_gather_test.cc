// `meshflow shard` and `meshflow gather` from the command line: round trips, and every error
// path's exit code and one-line message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshflow/core/compare.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharded_folder.h"
#include "tests/cli_runner.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;
using testing::fresh_dir;
using testing::run_meshflow;

class CliShardGather : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("cli");
    x_ = random_tensor(DType::kFloat32, {13, 6}, 42);
    write_npy(dir_ + "/x.npy", x_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Expects exit code `code` and one line on stderr containing `needle`, and no output folder.
  void expect_error(const std::string& args, int code, const std::string& needle) {
    auto r = run_meshflow(args);
    EXPECT_EQ(r.exit_code, code) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_FALSE(fs::exists(dir_ + "/out")) << "no output left behind by: " << args;
  }
  std::string shard_args(const std::string& mesh, const std::string& placements) {
    return "shard --input " + dir_ + "/x.npy --mesh " + mesh + " --placements '" + placements +
           "' --out " + dir_ + "/out";
  }

  std::string dir_;
  Tensor x_;
};

TEST_F(CliShardGather, RoundTripIsBitExactAndShowsBoxes) {
  auto r = run_meshflow(shard_args("2x2@4,5,6,7", "S(0),Shard(1)"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank3 device 7 box [7:13, 3:6]"), std::string::npos) << r.out;
  Layout l = read_layout(dir_ + "/out");
  EXPECT_EQ(to_string(l.mesh), "2x2@4,5,6,7");
  EXPECT_EQ(to_string(l.placements), "S(0),S(1)");
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  r = run_meshflow("gather --in " + dir_ + "/out --out " + dir_ + "/y.npy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(compare_exact(read_npy(dir_ + "/y.npy"), x_), std::nullopt);
}

TEST_F(CliShardGather, ReshardingOverAnExistingFolderReplacesIt) {
  ASSERT_EQ(run_meshflow(shard_args("4", "S(0)")).exit_code, 0);
  ASSERT_EQ(run_meshflow(shard_args("2", "R")).exit_code, 0);
  EXPECT_FALSE(fs::exists(dir_ + "/out/rank2.npy"));
  EXPECT_EQ(read_layout(dir_ + "/out").mesh.shape, (Shape{2}));
}

TEST_F(CliShardGather, GatherReducesPartialFolders) {
  Layout l =
      make_layout(make_mesh({2, 2}), parse_placements("P(avg),S(0)"), {4, 3}, DType::kFloat64);
  std::vector<Tensor> shards;
  for (int i = 0; i < 4; ++i) shards.push_back(random_tensor(DType::kFloat64, {2, 3}, i));
  write_sharded(dir_ + "/p", l, shards);
  auto r = run_meshflow("gather --in " + dir_ + "/p --out " + dir_ + "/y.npy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Tensor y = read_npy(dir_ + "/y.npy");
  for (int row = 0; row < 2; ++row) {
    for (int col = 0; col < 3; ++col) {
      // Device (0,0) and (1,0) hold rows 0-1; (0,1) and (1,1) rows 2-3.
      double top =
          (shards[0].data<double>()[row * 3 + col] + shards[2].data<double>()[row * 3 + col]) / 2;
      double bottom =
          (shards[1].data<double>()[row * 3 + col] + shards[3].data<double>()[row * 3 + col]) / 2;
      EXPECT_DOUBLE_EQ(y.data<double>()[row * 3 + col], top);
      EXPECT_DOUBLE_EQ(y.data<double>()[(row + 2) * 3 + col], bottom);
    }
  }
}

TEST_F(CliShardGather, HelpAndVersion) {
  auto r = run_meshflow("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("shard"), std::string::npos);
  r = run_meshflow("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("meshflow 0."), std::string::npos);
  r = run_meshflow("shard --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--placements"), std::string::npos);
}

TEST_F(CliShardGather, ShardErrorsNameTheOffendingValue) {
  expect_error(shard_args("2x2", "S(0),Q"), 1, "\"Q\"");
  expect_error(shard_args("2x2", "S(0)"), 1, "mesh 2x2 has 2 dims");
  expect_error(shard_args("2x2", "S(2),R"), 1,
               "\"S(2)\" names tensor dim 2 but the tensor has 2 dims");
  expect_error(shard_args("2x2", "P(sum),R"), 1, "P(sum)");
  expect_error(shard_args("2xx2", "R,R"), 1, "\"2xx2\"");
  expect_error(shard_args("2@1,1", "R"), 1, "device 1 twice");
  expect_error(
      "shard --input " + dir_ + "/missing.npy --mesh 2 --placements R --out " + dir_ + "/out", 1,
      "missing.npy");
  std::ofstream(dir_ + "/bad.npy") << "not an array";
  expect_error("shard --input " + dir_ + "/bad.npy --mesh 2 --placements R --out " + dir_ + "/out",
               1, "bad.npy: not a .npy file");
  expect_error("shard --input " + dir_ + "/x.npy --mesh 2", 2, "--placements");
  expect_error("frobnicate", 2, "frobnicate");
}

TEST_F(CliShardGather, OutputOverAFileIsRefused) {
  std::ofstream(dir_ + "/file") << "precious";
  auto r = run_meshflow("shard --input " + dir_ + "/x.npy --mesh 2 --placements R --out " + dir_ +
                        "/file");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("refusing to replace"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(dir_ + "/file"), "precious");
}

TEST_F(CliShardGather, GatherErrorsNameTheFileAtFault) {
  ASSERT_EQ(run_meshflow(shard_args("2x2", "S(0),R")).exit_code, 0);
  const std::string in = dir_ + "/out";
  const std::string gather = "gather --in " + in + " --out " + dir_ + "/y.npy";
  auto expect_gather_error = [&](const std::string& needle) {
    auto r = run_meshflow(gather);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ + "/y.npy"));
  };
  // Disagreeing replicas: devices 2 and 3 both hold rows 7..13.
  Tensor t = read_npy(in + "/rank3.npy");
  t.data<float>()[0] += 1.0f;
  write_npy(in + "/rank3.npy", t);
  expect_gather_error("replicas disagree: devices 2 (rank2) and 3 (rank3)");
  // A shard of the wrong shape.
  write_npy(in + "/rank1.npy", Tensor(DType::kFloat32, {2, 2}));
  expect_gather_error("rank1.npy: holds 2x2 float32 but layout.json gives device 1 box [0:7, 0:6]");
  // A replica's file may be absent (a checkpoint writes one copy per replica group): the
  // disagreement of 2 and 3 is still found; a representative's absent file is named.
  fs::remove(in + "/rank1.npy");
  expect_gather_error("replicas disagree: devices 2 (rank2) and 3 (rank3)");
  fs::remove(in + "/rank0.npy");
  expect_gather_error("rank0.npy");
  std::ofstream(in + "/layout.json") << "{\"mesh\": ";
  expect_gather_error("layout.json: invalid JSON");
  std::ofstream(in + "/layout.json")
      << R"({"mesh": {"shape": [2], "devices": [0, 1]}, "placements": ["R"], "dtype": "float32"})";
  expect_gather_error("missing field \"shape\"");
  std::ofstream(in + "/layout.json")
      << R"({"mesh": {"shape": [2], "devices": [0, 1]}, "placements": ["R"], "shape": [3], "dtype": "complex64"})";
  expect_gather_error("\"complex64\"");
  auto r = run_meshflow("gather --in " + dir_ + "/nowhere --out " + dir_ + "/y.npy");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nowhere"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace meshflow
