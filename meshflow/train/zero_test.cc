// ZeRO-1 and FSDP (DESIGN's "ZeRO"): each level trains as --zero 0 does with every optimizer
// option, clipping and micro-batches on data, tensor and sequence parallel layouts and a
// pipeline; the recording Communicator shows the collectives each level trades for the
// all-reduce; a quarter of the memory on 4-way data parallelism, estimated and measured; --save
// writes the model's layouts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "meshflow/core/compare.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/testing.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

struct Models {
  fs::path dir = fs::temp_directory_path() / fmt::format("meshflow_zero_{}", ::getpid());
  Models() {
    fs::create_directories(dir);
    Tensor labels(DType::kInt64, {8});
    for (std::int64_t i = 0; i < 8; ++i) labels.data<std::int64_t>()[i] = (i * 5 + 2) % 4;
    write_npy(dir / "labels.npy", labels);
  }
  ~Models() { fs::remove_all(dir); }
  // Data parallel; DP x TP with column- and row-parallel weights, a replicated bias and a
  // reduction; DP x TP with sequence parallelism and a sharded bias; a pipeline.
  std::vector<std::pair<std::string, Model>> all() const {
    return {{"data parallel", Model{.pcg = testing::sp_mlp(4, 1, 8)}},
            {"dp x tp", Model{.pcg = testing::dp_tp_mlp(dir / "labels.npy")}},
            {"dp x tp sequence parallel", Model{.pcg = testing::sp_mlp(2, 2, 8)}},
            {"pipeline", Model{.pcg = testing::pipeline(8)}}};
  }
};

std::vector<std::pair<std::string, Optimizer>> optimizers() {
  return {{"sgd", resolve_optimizer({.lr = 0.3})},
          {"sgd momentum, clipping",
           resolve_optimizer({.lr = 0.3, .momentum = 0.9, .clip_grad_norm = 0.05})},
          {"adamw, clipping", resolve_optimizer({.kind = OptimizerKind::kAdamW,
                                                 .lr = 0.05,
                                                 .weight_decay = 0.1,
                                                 .clip_grad_norm = 0.05})}};
}

TEST(Zero, EveryLevelTrainsAsZeroZeroDoes) {
  const Models models;
  for (const auto& [name, optimizer] : optimizers()) {
    for (const auto& [layout, model] : models.all()) {
      for (int m : {1, 4}) {
        std::map<int, std::vector<double>> losses;
        for (int zero : {0, 1, 3}) {
          const std::string what =
              fmt::format("{} on {}, M = {}, --zero {}", name, layout, m, zero);
          const TrainReport r = train_model(model, {.steps = 3,
                                                    .optimizer = optimizer,
                                                    .micro_batches = m,
                                                    .zero = zero,
                                                    .check = true});
          ASSERT_TRUE(r.check.has_value()) << what;
          EXPECT_LE(r.check->max_loss_diff, 2e-6) << what;
          EXPECT_LE(r.check->max_grad_diff, 2e-6) << what;
          EXPECT_LE(r.check->max_weight_diff, 4e-6) << what;
          for (const StepReport& s : r.steps) losses[zero].push_back(s.loss);
        }
        for (int zero : {1, 3}) {
          ASSERT_EQ(losses[zero].size(), losses[0].size());
          for (std::size_t i = 0; i < losses[0].size(); ++i)
            EXPECT_NEAR(losses[zero][i], losses[0][i], 1e-6)
                << name << " on " << layout << ", M = " << m << ", --zero " << zero << " step "
                << i + 1;
        }
      }
    }
  }
}

// Counts each device-0 call per collective and dtype ("all_gather float32"). A gather of
// blocks that are not contiguous in rank order (w2 [1024,32] is R,S(0) on a 4x1 mesh, so its
// ZeRO layout is S(1),S(0): column blocks) is an exchange_boxes (plan/lower.h): counted as the
// all-gather it is.
std::map<std::string, int> calls_of(const Pcg& g) {
  std::map<std::string, int> count;
  const std::map<DeviceId, CallLog> logs = record_calls(g);
  for (const RecordedCall& c : logs.at(0)) {
    const bool gather = c.collective == "exchange_boxes" && c.dtype == DType::kFloat32;
    ++count[fmt::format("{} {}", gather ? "all_gather" : c.collective, to_string(c.dtype))];
  }
  return count;
}

TEST(Zero, EachLevelTradesTheAllReduceForItsCollectives) {
  // 4-way data parallel: w0 [64,64] feeds e = x w0 (its input needs no gradient), w1 [64,1024]
  // and b1 [1024] feed h, w2 [1024,32] feeds o. Forward: 3 nodes read 4 weights; backward: h's
  // and o's input gradients read w1 and w2. (Each tensor large enough that the planner takes
  // the collective over point-to-point transfers.)
  const Pcg model = testing::sp_mlp(4, 1, 8, 64, 1024, 32);
  const UpdateRule adamw{.kind = OptimizerKind::kAdamW};
  const auto zero0 = calls_of(compile(model, Mode::kTrain, {.update = adamw}));
  EXPECT_EQ(zero0.at("all_reduce float32"), 4) << "one all-reduce per weight's gradient";
  EXPECT_EQ(zero0.count("reduce_scatter float32"), 0u);
  EXPECT_EQ(zero0.count("all_gather float32"), 0u);
  for (int m : {1, 4}) {
    const auto zero1 =
        calls_of(compile(model, Mode::kTrain, {.update = adamw, .micro_batches = m, .zero = 1}));
    EXPECT_EQ(zero1.count("all_reduce float32"), 0u) << m;
    EXPECT_EQ(zero1.at("reduce_scatter float32"), 4) << "one per weight and step, M = " << m;
    EXPECT_EQ(zero1.at("all_gather float32"), 4) << "one per weight and step, M = " << m;
    const auto zero3 =
        calls_of(compile(model, Mode::kTrain, {.update = adamw, .micro_batches = m, .zero = 3}));
    EXPECT_EQ(zero3.count("all_reduce float32"), 0u) << m;
    EXPECT_EQ(zero3.at("reduce_scatter float32"), 4 * m) << "one per weight and micro-batch";
    EXPECT_EQ(zero3.at("all_gather float32"), (4 + 2) * m) << "one per use and micro-batch";
  }
}

TEST(Zero, FourWayDataParallelHoldsAQuarter) {
  // w0 [64,64], w1 [64,128], b1 [128], w2 [128,32]: 16,512 parameters, w1 the largest layer.
  const Model model{.pcg = testing::sp_mlp(4, 1, 8, 64, 128, 32)};
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  const std::int64_t params = 64 * 64 + 64 * 128 + 128 + 128 * 32;
  const std::int64_t largest = 64 * 128 * 4;
  std::map<int, MemoryBreakdown> estimated, measured;
  for (int zero : {0, 1, 3}) {
    const Explanation e = explain_compiled(model.pcg, {.update = adamw.rule, .zero = zero});
    ASSERT_TRUE(e.memory.has_value());
    estimated[zero] = e.memory->at_peak;
    const TrainReport r = train_model(model, {.steps = 2, .optimizer = adamw, .zero = zero});
    measured[zero] = r.measured.at_peak;
    EXPECT_GE(r.measured.peak - e.memory->peak, 0) << zero;
    EXPECT_LE(r.measured.peak - e.memory->peak, 4 * 3) << zero << ": the reported scalars";
  }
  for (const auto* memory : {&estimated, &measured}) {
    const auto& m = *memory;
    EXPECT_EQ(m.at(0)[MemoryKind::kOptimizerState], 2 * 4 * params);
    EXPECT_EQ(m.at(1)[MemoryKind::kOptimizerState], 2 * 4 * params / 4) << "a quarter";
    EXPECT_EQ(m.at(3)[MemoryKind::kOptimizerState], 2 * 4 * params / 4) << "a quarter";
    const std::int64_t held = m.at(3)[MemoryKind::kWeights] + m.at(3)[MemoryKind::kGradients] +
                              m.at(3)[MemoryKind::kOptimizerState] + m.at(3)[MemoryKind::kGathered];
    EXPECT_LE(held, 4 * 4 * params / 4 + 2 * largest + largest)
        << "a quarter, two gathered weights and one unsharded gradient of the largest layer";
    EXPECT_LE(m.at(3)[MemoryKind::kGathered], 2 * largest) << "prefetch holds two";
    EXPECT_EQ(m.at(0)[MemoryKind::kGathered], 0);
  }
}

TEST(Zero, TheMemoryEstimateIsWhatTheRuntimeHolds) {
  const Models models;
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  for (const auto& [layout, model] : models.all()) {
    for (int zero : {1, 3}) {
      for (int m : {1, 4}) {
        const std::string what = fmt::format("{}, --zero {}, M = {}", layout, zero, m);
        const Explanation e =
            explain_compiled(model.pcg, {.update = adamw.rule, .micro_batches = m, .zero = zero});
        ASSERT_TRUE(e.memory.has_value()) << what;
        const TrainReport r =
            train_model(model, {.steps = 2, .optimizer = adamw, .micro_batches = m, .zero = zero});
        // The runtime also holds what it keeps for its report from the step before until this
        // step remakes it: the float32 loss, fetched each micro-batch, and two for the step, and
        // the float64 squared gradient norm.
        EXPECT_GE(r.measured.peak - e.memory->peak, 0) << what;
        EXPECT_LE(r.measured.peak - e.memory->peak, 4 * (m + 2) + 8) << what;
      }
    }
  }
}

// A data-parallel chain of `layers` equal 128x128 tanh linear layers and a classifier on 4
// devices, batch 16 (FSDP's own test model in the issue).
Pcg chain(int layers) {
  Pcg g;
  const DeviceMesh dp = make_mesh({4}, {0, 1, 2, 3});
  auto R = [] { return std::vector<Placement>{Placement::replicate()}; };
  auto S0 = [] { return std::vector<Placement>{Placement::shard(0)}; };
  ValueId h = add_input(g, "x", {{16, 128}}, dp, S0(), Source::normal(1, 7));
  for (int i = 0; i < layers; ++i) {
    const ValueId w = add_weight(g, fmt::format("w{}", i), {{128, 128}}, dp, R(),
                                 Source::normal(0.1, static_cast<std::uint64_t>(10 + i)));
    h = add_compute(g, fmt::format("l{}", i), Op{.type = OpType::kLinear}, {h, w});
    h = add_compute(g, fmt::format("a{}", i), Op{.type = OpType::kTanh}, {h});
  }
  const ValueId wc = add_weight(g, "wc", {{128, 10}}, dp, R(), Source::normal(0.1, 9));
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {h, wc});
  const ValueId t = add_input(g, "t", {{16, 10}}, dp, S0(), Source::normal(1, 8));
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t}));
  return g;
}

// FSDP holds no more than its bound: a quarter of --zero 0's weights, gradients, optimizer state
// and gathered weights, plus two gathered weights (the one in use and the one prefetched) and
// one unsharded gradient (waiting for its reduce-scatter), estimated and measured.
TEST(Zero, FsdpHoldsAQuarterPlusTwoGathersAndOneGradient) {
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  constexpr std::int64_t kLargest = 128 * 128 * 4;
  auto held = [](const MemoryBreakdown& m) {
    return m[MemoryKind::kWeights] + m[MemoryKind::kGradients] + m[MemoryKind::kOptimizerState] +
           m[MemoryKind::kGathered];
  };
  for (int layers : {6, 12}) {
    const Model m{.pcg = chain(layers)};
    std::map<int, MemoryBreakdown> est, measured;
    for (int zero : {0, 3}) {
      est[zero] = explain_compiled(m.pcg, {.update = adamw.rule, .zero = zero}).memory->at_peak;
      measured[zero] =
          train_model(m, {.steps = 2, .optimizer = adamw, .zero = zero}).measured.at_peak;
    }
    for (auto* kind : {&est, &measured}) {
      const std::string what =
          fmt::format("{} layers, {}", layers, kind == &est ? "estimated" : "measured");
      const std::int64_t bound = held((*kind)[0]) / 4 + 2 * kLargest + kLargest;
      EXPECT_LE(held((*kind)[3]), bound) << what;
      EXPECT_LE((*kind)[3][MemoryKind::kGathered], 2 * kLargest) << what;
    }
  }
}

TEST(Zero, FsdpSavesTheModelsLayouts) {
  const Models models;
  const Model model{.pcg = testing::sp_mlp(2, 2, 8)};
  std::map<int, fs::path> saved;
  for (int zero : {0, 3}) {
    saved[zero] = models.dir / fmt::format("saved{}", zero);
    ModelRunOptions run;
    run.save = saved[zero];
    train_model(model, {.run = run, .steps = 2, .optimizer = resolve_optimizer({}), .zero = zero});
  }
  for (const std::string w : {"w0", "w1", "b1", "w2"}) {
    const Node& n = model.pcg.nodes[static_cast<std::size_t>(find_value(model.pcg, w))];
    EXPECT_EQ(read_layout(saved[3] / w).placements, *n.placements) << w;
    const ShardedTensor a = read_sharded(saved[0] / w), b = read_sharded(saved[3] / w);
    ASSERT_EQ(a.shards.size(), b.shards.size()) << w;
    for (std::size_t i = 0; i < a.shards.size(); ++i)
      EXPECT_LE(max_abs_difference(a.shards[i], b.shards[i]), 1e-6) << w << " shard " << i;
  }
}

}  // namespace
}  // namespace meshflow
