// Training with every optimizer option against the float64 reference (train/reference_optimizer.h:
// torch.optim's formulas on whole tensors), on one device, data, tensor and sequence parallel
// layouts and a pipeline; optimizer state as graph values; clipping that bites; a non-finite
// step that stops before its update, or trains on when allowed.
#include "meshflow/train/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/testing.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

struct Layouts {
  fs::path dir = fs::temp_directory_path() / fmt::format("meshflow_trainer_{}", ::getpid());
  Layouts() {
    fs::create_directories(dir);
    Tensor labels(DType::kInt64, {8});
    for (std::int64_t i = 0; i < 8; ++i) labels.data<std::int64_t>()[i] = (i * 7 + 1) % 4;
    write_npy(dir / "labels.npy", labels);
  }
  ~Layouts() { fs::remove_all(dir); }
  // (name, model): one device, data parallel, tensor parallel, sequence parallel on dp x tp,
  // DP x TP with a reduction, and a two-stage pipeline.
  std::vector<std::pair<std::string, Model>> all() const {
    return {{"one device", Model{.pcg = testing::sp_mlp(1, 1, 8)}},
            {"data parallel", Model{.pcg = testing::sp_mlp(4, 1, 8)}},
            {"tensor parallel", Model{.pcg = testing::sp_mlp(1, 4, 8)}},
            {"dp x tp sequence parallel", Model{.pcg = testing::sp_mlp(2, 2, 8)}},
            {"dp x tp", Model{.pcg = testing::dp_tp_mlp(dir / "labels.npy")}},
            {"pipeline", Model{.pcg = testing::pipeline()}}};
  }
};

// The optimizer configurations tested: each option of DESIGN's list at work, clipping small
// enough to bite on these models.
std::vector<std::pair<std::string, Optimizer>> configurations() {
  return {
      {"sgd", resolve_optimizer({.lr = 0.3})},
      {"sgd momentum, clipping, warmup, cosine", resolve_optimizer({.lr = 0.3,
                                                                    .momentum = 0.9,
                                                                    .clip_grad_norm = 0.05,
                                                                    .warmup_steps = 2,
                                                                    .decay_steps = 3,
                                                                    .decay = LrDecay::kCosine})},
      {"adamw", resolve_optimizer({.kind = OptimizerKind::kAdamW, .lr = 0.02})},
      {"adamw betas, eps, weight decay, clipping, linear decay",
       resolve_optimizer({.kind = OptimizerKind::kAdamW,
                          .lr = 0.05,
                          .eps = 1e-6,
                          .weight_decay = 0.1,
                          .clip_grad_norm = 0.05,
                          .betas = std::pair{0.8, 0.95},
                          .warmup_steps = 1,
                          .decay_steps = 3,
                          .decay = LrDecay::kLinear})},
  };
}

TEST(Trainer, EveryOptimizerEqualsTheFloat64ReferenceOnEveryLayout) {
  const Layouts layouts;
  for (const auto& [name, optimizer] : configurations()) {
    for (const auto& [layout, model] : layouts.all()) {
      const TrainReport r = train_model(model, {.steps = 5, .optimizer = optimizer, .check = true});
      ASSERT_TRUE(r.check.has_value());
      const std::string what = name + " on " + layout;
      EXPECT_LE(r.check->max_loss_diff, 2e-6) << what;
      EXPECT_LE(r.check->max_grad_diff, 2e-6) << what;
      EXPECT_LE(r.check->max_weight_diff, 2e-6) << what;
      EXPECT_LT(r.steps.back().loss, r.steps.front().loss) << what << ": training lowers the loss";
    }
  }
}

TEST(Trainer, ClippingBitesAndAHugeBoundChangesNothing) {
  const Model m{.pcg = testing::sp_mlp(2, 2)};
  const Optimizer plain = resolve_optimizer({.kind = OptimizerKind::kAdamW, .lr = 0.05});
  Optimizer loose = plain, tight = plain;
  loose.rule.clip_grad_norm = 1e30;
  tight.rule.clip_grad_norm = 1e-3;
  auto losses = [&](const Optimizer& o) {
    std::vector<double> out;
    for (const StepReport& s : train_model(m, {.steps = 3, .optimizer = o}).steps)
      out.push_back(s.loss);
    return out;
  };
  const std::vector<double> a = losses(plain), b = losses(loose), c = losses(tight);
  EXPECT_EQ(a, b) << "a bound no norm reaches scales by exactly 1";
  EXPECT_NE(a[2], c[2]) << "a tight bound changes the steps";
}

TEST(Trainer, OptimizerStateIsAGraphValueInItsWeightsLayout) {
  const Pcg built = testing::sp_mlp(2, 2);
  for (const auto& [rule, states] : std::vector<std::pair<UpdateRule, std::vector<std::string>>>{
           {{.kind = OptimizerKind::kSgd}, {}},
           {{.kind = OptimizerKind::kSgd, .momentum = 0.9}, {"momentum_buffer"}},
           {{.kind = OptimizerKind::kAdamW}, {"exp_avg", "exp_avg_sq"}}}) {
    const Pcg g = compile(built, Mode::kTrain, {.update = rule});
    const Explanation e = explain(g);
    for (const std::string w : {"w0", "w1", "b1", "w2"}) {
      const Layout& layout = *g.nodes[static_cast<std::size_t>(find_value(g, w))].layout;
      for (const std::string& s : states) {
        const std::string name = w + "." + s;
        const Node& n = g.nodes[static_cast<std::size_t>(find_value(g, name))];
        EXPECT_EQ(n.kind, NodeKind::kState) << name;
        EXPECT_EQ(*n.layout, layout) << name;
        bool listed = false;
        for (const auto& [value, l] : e.values) listed = listed || (value == name && l == layout);
        EXPECT_TRUE(listed) << name << " is in explain's values";
      }
    }
    // The state moves nothing: the update's moves are the gradients' and the norm's.
    for (const MoveReport& mv : e.moves) {
      if (mv.phase != Phase::kUpdate) continue;
      EXPECT_TRUE(mv.value.starts_with("grad:") || mv.value == "grad_norm_sq") << mv.value;
    }
  }
}

TEST(Trainer, ANonFiniteStepStopsBeforeItsUpdateNamingTheStep) {
  const Layouts layouts;
  const Model m{.pcg = testing::dp_tp_mlp(layouts.dir / "labels.npy")};
  const fs::path save = layouts.dir / "saved";
  TrainOptions o{.steps = 4, .optimizer = resolve_optimizer({.lr = 1e30})};
  o.run.save = save;
  try {
    train_model(m, o);
    FAIL() << "a nan loss trained on";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "step 2: the loss is not finite; training stopped before its update and wrote "
              "nothing (--allow-nonfinite trains on)");
    EXPECT_EQ(e.scope(), ErrorScope::kEveryDevice);
  }
  EXPECT_FALSE(fs::exists(save)) << "nothing is written";
  o.allow_nonfinite = true;
  const TrainReport r = train_model(m, o);
  ASSERT_EQ(r.steps.size(), 4u);
  EXPECT_TRUE(std::isfinite(r.steps[0].loss));
  EXPECT_FALSE(std::isfinite(r.steps[1].loss));
  EXPECT_TRUE(to_json(r)["steps"][1]["loss"].is_null());
  EXPECT_TRUE(fs::exists(save / "w1" / "layout.json")) << "an allowed run saves";
}

TEST(Trainer, AnOverflowingFirstStepStopsBeforeAnyUpdate) {
  // A weight of 1e30: the first forward's product overflows float32 on its way to the loss.
  Pcg g;
  const DeviceMesh m = parse_mesh("2");
  const ValueId x = add_input(g, "x", {{4, 3}}, m, parse_placements("S(0)"), Source::normal(1, 1));
  const ValueId w = add_weight(g, "w", {{3, 3}}, m, parse_placements("R"),
                               Source{.kind = Source::Kind::kFill, .a = 1e30});
  const ValueId t = add_input(g, "t", {{4, 3}}, m, parse_placements("S(0)"), Source::normal(1, 2));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kMatmul}, {x, w});
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kTanh}, {h});
  const ValueId s = add_compute(g, "s", Op{.type = OpType::kMul}, {a, h});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {s, t}));
  try {
    train_model(Model{.pcg = g}, {.steps = 2});
    FAIL() << "an infinite loss trained on";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("step 1: the loss is not finite")) << e.what();
  }
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

TEST(MicroBatches, EqualTheFullBatchOnEveryLayoutWithSgdAndAdamw) {
  const Layouts layouts;
  for (const auto& [name, optimizer] : std::vector<std::pair<std::string, Optimizer>>{
           {"sgd momentum", resolve_optimizer({.lr = 0.3, .momentum = 0.9})},
           {"adamw, clipping",
            resolve_optimizer(
                {.kind = OptimizerKind::kAdamW, .lr = 0.02, .clip_grad_norm = 0.05})}}) {
    for (const auto& [layout, model] : layouts.all()) {
      std::vector<double> full;
      for (int m : {1, 2, 4}) {
        const std::string what = fmt::format("{} on {}, {} micro-batches", name, layout, m);
        // Every model's batch divides by 4 when it is 8 (the pipeline's is 6: 1 and 2 only).
        if (layout == "pipeline" && m == 4) continue;
        const TrainReport r = train_model(
            model, {.steps = 3, .optimizer = optimizer, .micro_batches = m, .check = true});
        ASSERT_TRUE(r.check.has_value()) << what;
        // The reference trains on the full batch: equal up to rounding.
        EXPECT_LE(r.check->max_loss_diff, 2e-6) << what;
        EXPECT_LE(r.check->max_grad_diff, 2e-6) << what;
        EXPECT_LE(r.check->max_weight_diff, 2e-6) << what;
        std::vector<double> losses;
        for (const StepReport& s : r.steps) losses.push_back(s.loss);
        if (m == 1) full = losses;
        for (std::size_t i = 0; i < losses.size(); ++i)
          EXPECT_NEAR(losses[i], full[i], 2e-6) << what << " step " << i + 1;
      }
    }
  }
}

std::string micro_error(const Pcg& g, int m) {
  try {
    train_model(Model{.pcg = g}, {.steps = 1, .micro_batches = m});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MicroBatches, RefuseWhatDoesNotSplitNamingTheNodeOrTensor) {
  const DeviceMesh mesh = parse_mesh("2");
  auto base = [&](Pcg& g) {
    const ValueId x =
        add_input(g, "x", {{8, 3}}, mesh, parse_placements("S(0)"), Source::normal(1, 1));
    const ValueId w =
        add_weight(g, "w", {{3, 3}}, mesh, parse_placements("R"), Source::normal(1, 2));
    return add_compute(g, "h", Op{.type = OpType::kMatmul}, {x, w});
  };
  {
    Pcg g;
    const ValueId h = base(g);
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMean, .dims = {0, 1}}, {h}));
    EXPECT_EQ(micro_error(g, 3),
              "input \"x\" of shape 8x3 does not split into 3 micro-batches along dim 0");
    EXPECT_EQ(micro_error(g, 4), "") << "a mean over the rows is a loss micro-batches take";
  }
  {
    Pcg g;
    const ValueId h = base(g);
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kSum, .dims = {0, 1}}, {h}));
    EXPECT_EQ(micro_error(g, 2),
              "node \"loss\" is a sum over the rows (a loss must be a mean): it cannot run in 2 "
              "micro-batches");
  }
  {
    Pcg g;
    const ValueId h = base(g);
    const ValueId s = add_compute(g, "colsum", Op{.type = OpType::kSum, .dims = {0}}, {h});
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMean, .dims = {0}}, {s}));
    EXPECT_EQ(micro_error(g, 2),
              "node \"colsum\" sums over the rows before the loss: it cannot run in 2 "
              "micro-batches");
  }
  {
    Pcg g;
    const ValueId h = base(g);
    const ValueId r = add_compute(g, "r", Op{.type = OpType::kReshape, .shape = {8, 3, 1}}, {h});
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMean, .dims = {0, 1, 2}}, {r}));
    EXPECT_EQ(micro_error(g, 2),
              "node \"r\" fixes dim 0 to 8 (write the rows' dim as -1): it cannot run in 2 "
              "micro-batches");
  }
  {
    // A mask that is no batch: not split, read whole by every micro-batch.
    Pcg g;
    const ValueId h = base(g);
    add_input(g, "mask", {{3}}, mesh, parse_placements("R"), Source::normal(1, 3));
    g.nodes.back().batch = false;
    const ValueId masked =
        add_compute(g, "masked", Op{.type = OpType::kMul}, {h, find_value(g, "mask")});
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMean, .dims = {0, 1}}, {masked}));
    EXPECT_EQ(micro_error(g, 2), "");
  }
}

TEST(MicroBatches, GradientReductionsDoNotGrowWithTheirNumber) {
  const Model m{.pcg = testing::sp_mlp(4, 1, 8)};  // data parallel over 4
  std::vector<std::size_t> calls;
  for (int micro : {1, 4}) {
    const Pcg g = compile(m.pcg, Mode::kTrain, {.micro_batches = micro});
    const auto logs = record_calls(g);
    calls.push_back(logs.at(0).size());
    for (const RecordedCall& c : logs.at(0))
      EXPECT_EQ(c.group, first_devices(4)) << micro << " " << to_string(c);
  }
  EXPECT_EQ(calls[0], calls[1]) << "one reduction per gradient and the norm's, whatever M";
  EXPECT_EQ(calls[0], 5u) << "w0, w1, b1, w2 and the squared norm";
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

TEST(Memory, TheEstimateIsWhatTheRuntimeHolds) {
  const Layouts layouts;
  for (const auto& [layout, model] : layouts.all()) {
    for (int m : {1, 2, 4}) {
      if (m == 4 && layout == "pipeline") continue;  // its batch of 6 does not split in 4
      const std::string what = fmt::format("{}, {} micro-batches", layout, m);
      const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
      const Explanation e = explain_compiled(model.pcg, {.update = adamw.rule, .micro_batches = m});
      ASSERT_TRUE(e.memory.has_value()) << what;
      const TrainReport r =
          train_model(model, {.steps = 2, .optimizer = adamw, .micro_batches = m});
      // The runtime also holds the float32 scalars it reports, which the estimate leaves out:
      // the loss fetched to the leader each micro-batch and two for the step.
      EXPECT_LE(r.measured.peak - e.memory->peak, 4 * (m + 2)) << what;
      EXPECT_GE(r.measured.peak - e.memory->peak, 0) << what;
      EXPECT_EQ(e.memory->at_peak.total(), e.memory->peak) << what;
      EXPECT_EQ(r.measured.at_peak.total(), r.measured.peak) << what;
      EXPECT_GT(e.memory->at_peak[MemoryKind::kOptimizerState], 0) << what;
    }
  }
}

}  // namespace
}  // namespace meshflow
