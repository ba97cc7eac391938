// Checkpoints: a resumed run equals the uninterrupted one bit for bit on the same layout and up
// to rounding on another mesh, placements or ZeRO level; one file per replica group; keep-last;
// every error one line naming the file, the tensors or the optimizer, with nothing loaded.
#include "meshflow/train/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "meshflow/comm/launch.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/graph/testing.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::temp_directory_path() / fmt::format("meshflow_ckpt_{}", ::getpid());
  Dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

const Optimizer kAdamW =
    resolve_optimizer({.kind = OptimizerKind::kAdamW, .lr = 0.02, .clip_grad_norm = 0.5});
const Optimizer kMomentum = resolve_optimizer({.lr = 0.2, .momentum = 0.9, .warmup_steps = 2});

std::vector<double> losses(const TrainReport& r) {
  std::vector<double> out;
  for (const StepReport& s : r.steps) out.push_back(s.loss);
  return out;
}

TEST(Checkpoint, ResumingEqualsTheUninterruptedRunBitForBit) {
  const Dir dir;
  const Model model{.pcg = testing::sp_mlp(2, 2, 8)};
  for (const Optimizer& optimizer : {kAdamW, kMomentum}) {
    for (int zero : {0, 3}) {
      const std::string what = fmt::format("{} --zero {}", to_string(optimizer.rule.kind), zero);
      ModelRunOptions whole_run, resumed_run;
      whole_run.save = dir.path / "whole";
      resumed_run.save = dir.path / "resumed";
      const TrainReport whole =
          train_model(model, {.run = whole_run, .steps = 4, .optimizer = optimizer, .zero = zero});
      const fs::path ck = dir.path / fmt::format("ck_{}_{}", to_string(optimizer.rule.kind), zero);
      train_model(model, {.steps = 2,
                          .optimizer = optimizer,
                          .zero = zero,
                          .checkpoint = CheckpointOptions{.dir = ck}});
      const TrainReport resumed = train_model(
          model,
          {.run = resumed_run, .steps = 2, .optimizer = optimizer, .zero = zero, .resume = ck});
      ASSERT_EQ(resumed.steps.size(), 2u) << what;
      EXPECT_EQ(resumed.steps[0].step, 3) << what << ": step numbers go on";
      const std::vector<double> all = losses(whole);
      EXPECT_EQ(losses(resumed), std::vector<double>(all.begin() + 2, all.end())) << what;
      for (const std::string w : {"w0", "w1", "b1", "w2"}) {
        const ShardedTensor a = read_sharded(dir.path / "whole" / w);
        const ShardedTensor b = read_sharded(dir.path / "resumed" / w);
        for (std::size_t i = 0; i < a.shards.size(); ++i)
          EXPECT_EQ(max_abs_difference(a.shards[i], b.shards[i]), 0.0) << what << " " << w;
      }
    }
  }
}

TEST(Checkpoint, ResumesOntoAnotherMeshPlacementsOrZeroLevel) {
  const Dir dir;
  // The same weights on one device, 4-way DP, and DP x TP with sequence parallelism.
  const Model one{.pcg = testing::sp_mlp(1, 1, 8)}, dp{.pcg = testing::sp_mlp(4, 1, 8)},
      dp_tp{.pcg = testing::sp_mlp(2, 2, 8)};
  const std::vector<double> whole = losses(train_model(one, {.steps = 4, .optimizer = kAdamW}));
  struct Case {
    const char* what;
    const Model* from;
    int from_zero;
    const Model* to;
    int to_zero;
  };
  for (const Case& c : std::vector<Case>{{"DP -> DP x TP", &dp, 0, &dp_tp, 0},
                                         {"DP x TP -> one device", &dp_tp, 0, &one, 0},
                                         {"one device -> DP x TP", &one, 0, &dp_tp, 0},
                                         {"--zero 1 -> --zero 0", &dp, 1, &dp, 0},
                                         {"--zero 3 -> DP x TP --zero 1", &dp, 3, &dp_tp, 1}}) {
    const fs::path ck = dir.path / c.what;
    train_model(*c.from, {.steps = 2,
                          .optimizer = kAdamW,
                          .zero = c.from_zero,
                          .checkpoint = CheckpointOptions{.dir = ck}});
    const TrainReport r = train_model(
        *c.to, {.steps = 2, .optimizer = kAdamW, .zero = c.to_zero, .check = true, .resume = ck});
    ASSERT_TRUE(r.check.has_value()) << c.what;
    EXPECT_LE(r.check->max_loss_diff, 2e-6) << c.what << ": against one device resumed alike";
    EXPECT_LE(r.check->max_weight_diff, 2e-6) << c.what;
    for (std::size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(r.steps[i].loss, whole[i + 2], 2e-6) << c.what << " step " << i + 3;
  }
}

TEST(Checkpoint, WritesOneCopyPerReplicaGroupAndKeepsTheNewest) {
  const Dir dir;
  const Model dp{.pcg = testing::sp_mlp(4, 1, 8)};
  train_model(dp, {.steps = 4,
                   .optimizer = kAdamW,
                   .zero = 1,
                   .checkpoint = CheckpointOptions{.dir = dir.path, .every = 1, .keep_last = 2}});
  const std::vector<fs::path> complete = complete_checkpoints(dir.path);
  ASSERT_EQ(complete.size(), 2u);
  EXPECT_EQ(complete[0].filename(), "step-3");
  EXPECT_EQ(complete[1].filename(), "step-4");
  const Checkpoint c = read_checkpoint(complete[1]);
  EXPECT_EQ(c.step, 4);
  EXPECT_EQ(c.optimizer, to_json(kAdamW));
  // The weights are replicated over the 4 devices (w1 R,S(1) on a 4x1 mesh): one file. Their
  // ZeRO-1 state is sharded over the 4: four files.
  EXPECT_EQ(c.tensors.at("w1").files.size(), 1u);
  EXPECT_TRUE(c.tensors.at("w1").files.count("rank0.npy"));
  EXPECT_EQ(c.tensors.at("w1.exp_avg").files.size(), 4u);
  EXPECT_EQ(c.tensors.at("w1.exp_avg").layout.placements, parse_placements("S(0),S(1)"));
  EXPECT_TRUE(damaged_files(c).empty());
  EXPECT_EQ(list_checkpoints(dir.path, true)["checkpoints"][1]["verified"], true);
}

TEST(Checkpoint, WritesLargeShardsUnbufferedAsNpyFiles) {
  const Dir dir;
  // 4 MiB and more: block-aligned memory, written unbuffered; one with a partial last block.
  const std::vector<Shape> shapes = {{1024, 1024}, {1031, 1031}, {3, 5}};
  std::vector<Tensor> tensors;
  std::vector<SavedTensor> saved;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    tensors.push_back(random_tensor(DType::kFloat32, shapes[i], 40 + i));
    saved.push_back(
        {fmt::format("t{}", i), make_layout(parse_mesh("1"), {Placement::replicate()}, shapes[i])});
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) saved[i].shard = &tensors[i];
  launch({.devices = first_devices(1)}, [&](Communicator& world) {
    save_checkpoint(world, 0, {.dir = dir.path}, 1, {{"kind", "sgd"}}, saved);
  });
  const Checkpoint c = read_checkpoint(dir.path / "step-1");
  EXPECT_TRUE(damaged_files(c).empty());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const fs::path file = dir.path / "step-1" / saved[i].name / "rank0.npy";
    EXPECT_EQ(max_abs_difference(read_npy(file), tensors[i]), 0.0) << file;
    if (i < 2) {
      EXPECT_EQ(static_cast<std::int64_t>(fs::file_size(file)),
                kDirectAlignment + static_cast<std::int64_t>(tensors[i].nbytes()))
          << "a block of header, then the data, cut to its size";
    }
  }
}

// Returns the error a resume of `model` from `ck` throws ("" when none).
std::string resume_error(const Model& model, const fs::path& ck, const Optimizer& optimizer) {
  try {
    train_model(model, {.steps = 1, .optimizer = optimizer, .resume = ck});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, EveryDamageOrMismatchIsOneLineAndLoadsNothing) {
  const Dir dir;
  const Model model{.pcg = testing::sp_mlp(2, 2, 8)};
  train_model(model, {.steps = 2,
                      .optimizer = kAdamW,
                      .checkpoint = CheckpointOptions{.dir = dir.path, .every = 1}});
  const fs::path newest = dir.path / "step-2";
  const fs::path file = newest / "w1" / "rank1.npy";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(150);
    char b = 0;
    f.read(&b, 1);
    f.seekp(150);
    b = static_cast<char>(b ^ 0x10);
    f.write(&b, 1);
  }
  EXPECT_EQ(resume_error(model, dir.path, kAdamW),
            fmt::format("{}: its bytes do not match its sha256 (resume from {} instead)",
                        file.string(), (dir.path / "step-1").string()));
  EXPECT_EQ(damaged_files(read_checkpoint(newest)),
            std::vector<std::string>{file.string() + ": its bytes do not match its sha256"});
  const fs::path older = dir.path / "step-1";
  const fs::path gone = older / "b1.exp_avg" / "rank0.npy";
  fs::remove(gone);
  EXPECT_EQ(resume_error(model, older, kAdamW), gone.string() + ": missing");
  train_model(
      model,
      {.steps = 1, .optimizer = kAdamW, .checkpoint = CheckpointOptions{.dir = dir.path / "good"}});
  const fs::path good = dir.path / "good";
  EXPECT_EQ(resume_error(model, good, kMomentum),
            fmt::format("{} was saved with --optimizer adamw, not sgd: resume it with --optimizer "
                        "adamw",
                        (good / "step-1").string()));
  EXPECT_EQ(resume_error(Model{.pcg = testing::sp_mlp(2, 2, 8, 5, 9)}, good, kAdamW),
            fmt::format("tensor \"b1\": {} holds float32 7 but the model says float32 9",
                        (good / "step-1").string()));
  // The pipeline's w1 and w2 are there under those names (of other shapes: names come first).
  EXPECT_EQ(resume_error(Model{.pcg = testing::pipeline(8)}, good, kAdamW),
            fmt::format("{} holds tensors the model lacks: b1, b1.exp_avg, b1.exp_avg_sq, w0, "
                        "w0.exp_avg, w0.exp_avg_sq",
                        (good / "step-1").string()));
  {
    Tensor labels(DType::kInt64, {8});
    for (std::int64_t i = 0; i < 8; ++i) labels.data<std::int64_t>()[i] = i % 4;
    write_npy(dir.path / "labels.npy", labels);
  }
  EXPECT_EQ(resume_error(Model{.pcg = testing::dp_tp_mlp(dir.path / "labels.npy")}, good, kAdamW),
            fmt::format("{} lacks tensors the model has: b2, b2.exp_avg, b2.exp_avg_sq",
                        (good / "step-1").string()));
  fs::create_directories(dir.path / "empty" / ".step-3.partial");
  EXPECT_EQ(
      resume_error(model, dir.path / "empty", kAdamW),
      fmt::format("--resume \"{}\": no complete checkpoint in it", (dir.path / "empty").string()))
      << "a half-written checkpoint is none";
}

TEST(Checkpoint, BackgroundWritesMakeTheFilesAForegroundWriteMakes) {
  const Dir dir;
  // Two tensors on a 2x2 mesh, one sharded both ways, one replicated over dim 1 (one copy per
  // replica group), written by save_checkpoint and by CheckpointWriter.
  const DeviceMesh mesh = make_mesh({2, 2}, {0, 1, 2, 3});
  const Layout a = make_layout(mesh, {Placement::shard(0), Placement::shard(1)}, {6, 10});
  const Layout b = make_layout(mesh, {Placement::shard(1), Placement::replicate()}, {3, 8});
  const Tensor ga = random_tensor(DType::kFloat32, a.shape, 11);
  const Tensor gb = random_tensor(DType::kFloat32, b.shape, 12);
  const std::vector<Tensor> sa = shard_tensor(ga, a), sb = shard_tensor(gb, b);
  const nlohmann::json optimizer = {{"kind", "adamw"}};
  const nlohmann::json data = {{"rows", 12}};
  for (const bool background : {false, true}) {
    const fs::path ck = dir.path / (background ? "background" : "foreground");
    launch({.devices = first_devices(4)}, [&](Communicator& world) {
      const auto d = static_cast<std::size_t>(world.device());
      const std::vector<SavedTensor> tensors = {{"a", a, &sa[d]}, {"b", b, &sb[d]}};
      if (!background) {
        save_checkpoint(world, 0, {.dir = ck}, 5, optimizer, tensors, data);
        return;
      }
      CheckpointWriter writer(0, {.dir = ck});
      writer.start(world, 5, optimizer, tensors, data);
      writer.poll(world, /*wait=*/true, /*last=*/true);
    });
  }
  const std::string foreground = read_file(dir.path / "foreground" / "step-5" / "checkpoint.json");
  const std::string background = read_file(dir.path / "background" / "step-5" / "checkpoint.json");
  EXPECT_EQ(background, foreground);  // the same files, layouts, hashes, optimizer and data
  EXPECT_NE(foreground.find("\"rank1.npy\""), std::string::npos);
  EXPECT_EQ(read_file(dir.path / "background" / "step-5" / "b" / "layout.json"),
            read_file(dir.path / "foreground" / "step-5" / "b" / "layout.json"));
  EXPECT_TRUE(damaged_files(read_checkpoint(dir.path / "background" / "step-5")).empty());
}

TEST(Checkpoint, AWriteNotCommittedIsNeverCommitted) {
  const Dir dir;
  const DeviceMesh mesh = make_mesh({2}, {0, 1});
  const Layout a = make_layout(mesh, {Placement::shard(0)}, {8, 4});
  const Tensor ga = random_tensor(DType::kFloat32, a.shape, 3);
  const std::vector<Tensor> sa = shard_tensor(ga, a);
  const fs::path ck = dir.path / "ck";
  launch({.devices = first_devices(2)}, [&](Communicator& world) {
    const std::vector<SavedTensor> tensors = {
        {"a", a, &sa[static_cast<std::size_t>(world.device())]}};
    CheckpointWriter writer(0, {.dir = ck});
    writer.start(world, 2, {}, tensors);
    writer.poll(world, /*wait=*/true);  // step 2 committed
    writer.start(world, 4, {}, tensors);
    // The run fails here: the writer goes with step 4 uncommitted.
  });
  const std::vector<fs::path> complete = complete_checkpoints(ck);
  ASSERT_EQ(complete.size(), 1u);
  EXPECT_EQ(complete.back().filename(), "step-2");
  EXPECT_TRUE(damaged_files(read_checkpoint(complete.back())).empty());
}

}  // namespace
}  // namespace meshflow
