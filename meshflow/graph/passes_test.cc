// Each pass on small graphs, as golden text: the graph after every pass and the task graph of
// DESIGN.md's DP×TP MLP and of a two-stage pipeline, and the sequence-parallel MLP decomposed
// for --overlap. A change to any pass shows here as a diff.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "meshflow/core/golden.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/graph/testing.h"
#include "meshflow/ops/attention.h"

namespace meshflow {
namespace {

std::string passes_text(const std::string& title, const Pcg& built) {
  std::string out = "#### " + title + "\n== built\n" + to_text(built);
  Pcg g = infer_layouts(built);
  out += "== infer_layouts\n" + to_text(g);
  g = expand_backward(std::move(g));
  out += "== expand_backward\n" + to_text(g);
  g = add_update(infer_layouts(std::move(g)));
  out += "== infer_layouts, add_update\n" + to_text(g);
  g = insert_copies(infer_layouts(std::move(g)));
  out += "== infer_layouts, insert_copies\n" + to_text(g);
  EXPECT_EQ(g, compile(built, Mode::kTrain)) << "compile runs the same pipeline";
  out += "== expand_shards\n" + to_text(expand_shards(g, {}));
  out += "== explain\n" + to_text(explain(g));
  return out;
}

// Compares `got` with testdata/<file>; on a difference writes <file>.actual.txt (core/golden.h).
void expect_golden(const std::string& got, const std::string& file) {
  EXPECT_EQ(golden_mismatch(got, std::string(MESHFLOW_GRAPH_TESTDATA) + "/" + file,
                            file.substr(0, file.rfind('.')) + ".actual.txt"),
            "");
}

TEST(PassesGolden, EveryPassOnTheDpTpMlpAndAPipeline) {
  expect_golden(passes_text("dp_tp_mlp", testing::dp_tp_mlp("labels.npy")) +
                    passes_text("pipeline", testing::pipeline()),
                "passes_golden.txt");
}

TEST(PassesGolden, DecomposeCollectivesOnTheSequenceParallelMlp) {
  const Pcg g = compile(testing::sp_mlp(1, 2, 5), Mode::kTrain,
                        {.overlap = true, .decompose = {.always = true}});
  expect_golden("== decompose_collectives\n" + to_text(g) + "== expand_shards\n" +
                    to_text(expand_shards(g, {})) + "== explain\n" + to_text(explain(g)),
                "decompose_golden.txt");
}

TEST(Passes, BackwardAddsOnlyWhatTheWeightsNeed) {
  const Pcg g = compile(testing::pipeline(), Mode::kTrain);
  // x is an input: no node computes its gradient, and none computes the gradient of the
  // labels-like target t.
  EXPECT_EQ(g.names.count("grad:x"), 0u);
  EXPECT_EQ(g.names.count("grad:t"), 0u);
  EXPECT_EQ(g.names.count("grad:w1"), 1u);
  EXPECT_EQ(g.names.count("grad:w2"), 1u);
  int updates = 0;
  for (const Node& n : g.nodes) updates += n.kind == NodeKind::kUpdate;
  EXPECT_EQ(updates, 2);
}

TEST(Passes, ATaskGraphReleasesEveryValueItDoesNotKeep) {
  const Pcg g = compile(testing::dp_tp_mlp("labels.npy"), Mode::kTrain);
  const TaskGraph t = expand_shards(g, {});
  for (const DeviceTasks& dt : t.devices) {
    std::set<ValueId> made, released;
    for (const Task& task : dt.tasks) {
      made.insert(task.out);
      released.insert(task.release.begin(), task.release.end());
    }
    for (ValueId v : made) {
      const Node& n = g.nodes[static_cast<std::size_t>(v)];
      if (n.kind == NodeKind::kUpdate) continue;  // an update writes its weight (a source)
      EXPECT_TRUE(released.count(v)) << "device " << dt.device << " keeps " << n.name;
    }
  }
}

// In micro-batches, a kernel adds into its value's running sum exactly where the value is
// accumulated (read once per step or kept) and no per-micro-batch task reads it: the weight
// gradients' products on every device; never a move, never the kept loss that the step's
// report fetches each micro-batch.
TEST(Passes, KernelsAccumulateOnlyValuesNoMicroBatchTaskReads) {
  const Pcg g = compile(testing::dp_tp_mlp("labels.npy", 8), Mode::kTrain, {.micro_batches = 2});
  const TaskGraph t = expand_shards(g, {*g.loss});
  for (const DeviceTasks& dt : t.devices) {
    const std::set<ValueId> accumulated(dt.accumulated.begin(), dt.accumulated.end());
    std::set<ValueId> read_per_micro_batch;
    for (const Task& task : dt.tasks) {
      if (task.once_per_step) continue;
      for (ValueId v : task_reads(task)) read_per_micro_batch.insert(v);
    }
    int accumulating = 0;
    for (const Task& task : dt.tasks) {
      const bool want = std::holds_alternative<ComputeTask>(task.work) &&
                        accumulated.count(task.out) && !read_per_micro_batch.count(task.out);
      EXPECT_EQ(task.accumulates, want) << "device " << dt.device << " " << t.names[task.out];
      accumulating += task.accumulates;
    }
    EXPECT_GE(accumulating, 2) << "device " << dt.device << ": w1's and w2's gradients";
  }
}

// Attention's three gradients of one attention run as one task per device (ComputeTask::fused,
// one pass sharing the probabilities), layer norm's scale and bias gradients as another (one
// pass over g), and every layer norm with the statistics its gradients read (made in the forward
// phase, in the same pass), on every GPT layout, in one micro-batch and in two: each value is
// made by one task only, and every value made is dropped or summed over the micro-batches.
TEST(Passes, SiblingGradientsRunAsOneTask) {
  for (const char* file : {"gpt_dp.json", "gpt_tp.json", "gpt_sp.json", "gpt_pp.json"}) {
    const Model m = load_model(std::filesystem::path(MESHFLOW_EXAMPLES_DIR) / "gpt" / file);
    for (int micro : {1, 2}) {
      const Pcg g = compile(m.pcg, Mode::kTrain, {.micro_batches = micro});
      const TaskGraph t = expand_shards(g, {*g.loss});
      const std::string what = fmt::format("{}, {} micro-batches", file, micro);
      int attention = 0, layer_norm = 0, norm_stats = 0;
      for (const DeviceTasks& dt : t.devices) {
        std::map<ValueId, int> made;
        std::set<ValueId> released, fused;
        for (const Task& task : dt.tasks) {
          for (ValueId v : values_made(task)) ++made[v];
          released.insert(task.release.begin(), task.release.end());
          const auto* c = std::get_if<ComputeTask>(&task.work);
          if (!c || c->fused.empty()) continue;
          std::set<OpType> types = {c->call->op.type};
          for (const FusedKernel& f : c->fused) types.insert(f.op.type);
          const bool attention_grads =
              types == std::set<OpType>{OpType::kAttentionGradQ, OpType::kAttentionGradK,
                                        OpType::kAttentionGradV};
          const bool norm_grads =
              types == std::set<OpType>{OpType::kLayerNormGradW, OpType::kSumTo};
          const bool forward_norm =
              types == std::set<OpType>{OpType::kLayerNorm, OpType::kLayerNormStats};
          EXPECT_TRUE(attention_grads || norm_grads || forward_norm)
              << what << ": " << t.names[task.out];
          EXPECT_EQ(task.phase, forward_norm ? Phase::kForward : Phase::kBackward)
              << what << ": " << t.names[task.out];
          attention += attention_grads;
          layer_norm += norm_grads;
          norm_stats += forward_norm;
          const std::vector<ValueId> v = values_made(task);
          fused.insert(v.begin(), v.end());
        }
        for (const auto& [v, times] : made) {
          EXPECT_EQ(times, 1) << what << ": device " << dt.device << " makes " << t.names[v];
          EXPECT_TRUE(released.count(v) || v == *g.loss ||
                      std::count(dt.accumulated.begin(), dt.accumulated.end(), v))
              << what << ": device " << dt.device << " keeps " << t.names[v];
        }
        for (ValueId id = 0; id < static_cast<ValueId>(g.nodes.size()); ++id) {
          const Node& n = g.nodes[static_cast<std::size_t>(id)];
          // (layer norm's two share a task only where layout inference gave them g in one
          // layout: not where a micro-batched step moves g for dx and dw and not for the bias)
          const bool attention_grad =
              is_attention_family(n.op.type) && n.op.type != OpType::kAttention;
          if (n.kind == NodeKind::kCompute && n.op.type == OpType::kLayerNormGradX) {
            EXPECT_EQ(g.nodes[static_cast<std::size_t>(n.inputs[3])].op.type,
                      OpType::kLayerNormStats)
                << what << ": " << n.name;
          }
          const bool stats = n.op.type == OpType::kLayerNormStats;
          if (n.kind != NodeKind::kCompute || !(attention_grad || stats) ||
              !find_device(n.layout->mesh, dt.device))
            continue;
          EXPECT_TRUE(fused.count(id))
              << what << ": device " << dt.device << " runs " << n.name << " alone";
        }
      }
      EXPECT_GT(attention, 0) << what;
      EXPECT_GT(layer_norm, 0) << what;
      EXPECT_GT(norm_stats, 0) << what;
    }
  }
}

// Gradients summed over micro-batches (here q's, k's and v's: weights, read by their updates) run
// fused too: made in one pass, then added to their sums (the task never adds into them itself).
TEST(Passes, AttentionsGradientsOfWeightsRunAsOneTaskAndAreAdded) {
  Pcg g;
  const DeviceMesh mesh = parse_mesh("1");
  std::vector<ValueId> qkv;
  for (const char* name : {"q", "k", "v"})
    qkv.push_back(add_weight(g, name, {{2, 8, 4}}, mesh, parse_placements("R"),
                             Source::normal(1, qkv.size() + 1)));
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kAttention, .causal = true}, qkv);
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kSum, .dims = {0, 1, 2}}, {o}));
  const Pcg c = compile(g, Mode::kTrain, {.micro_batches = 2});
  const TaskGraph t = expand_shards(c, {*c.loss});
  const DeviceTasks& dt = t.devices.at(0);
  int fused = 0;
  for (const Task& task : dt.tasks) {
    const auto* k = std::get_if<ComputeTask>(&task.work);
    if (!k || k->fused.empty()) continue;
    ++fused;
    EXPECT_EQ(k->fused.size(), 2u);
    EXPECT_FALSE(task.accumulates);
    for (ValueId v : values_made(task))
      EXPECT_EQ(std::count(dt.accumulated.begin(), dt.accumulated.end(), v), 1) << t.names[v];
  }
  EXPECT_EQ(fused, 1);
}

// Layer norm's gradients read the rows' statistics as a forward value, "<norm>:layer_norm_stats"
// on its x, made before every backward node and in the layer norm's own task (one per device, in
// the forward phase); a layer norm that no weight's gradient flows through keeps none.
TEST(Passes, LayerNormKeepsItsStatisticsForItsGradients) {
  Pcg g;
  const DeviceMesh mesh = parse_mesh("2");
  const ValueId x =
      add_input(g, "x", {{4, 6, 8}}, mesh, parse_placements("S(0)"), Source::normal(1, 1));
  const ValueId w = add_weight(g, "w", {{8}}, mesh, parse_placements("R"), Source::normal(1, 2));
  const ValueId b = add_weight(g, "b", {{8}}, mesh, parse_placements("R"), Source::normal(1, 3));
  const ValueId v = add_weight(g, "v", {{8}}, mesh, parse_placements("R"), Source::normal(1, 5));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kMul}, {x, v});
  const ValueId norm =
      add_compute(g, "norm", Op{.type = OpType::kLayerNorm, .eps = 1e-3}, {h, w, b});
  // A second norm of x with constant scale and bias: nothing to train through it.
  const ValueId scale =
      add_input(g, "scale", {{8}}, mesh, parse_placements("R"), Source::normal(1, 4));
  const ValueId frozen =
      add_compute(g, "frozen", Op{.type = OpType::kLayerNorm}, {x, scale, scale});
  const ValueId both = add_compute(g, "both", Op{.type = OpType::kMul}, {norm, frozen});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kSum, .dims = {0, 1, 2}}, {both}));
  const Pcg c = compile(g, Mode::kTrain);
  std::vector<ValueId> stats;
  ValueId first_backward = static_cast<ValueId>(c.nodes.size());
  for (ValueId id = 0; id < static_cast<ValueId>(c.nodes.size()); ++id) {
    const Node& n = c.nodes[static_cast<std::size_t>(id)];
    if (n.phase != Phase::kForward) first_backward = std::min(first_backward, id);
    if (n.kind == NodeKind::kCompute && n.op.type == OpType::kLayerNormStats) stats.push_back(id);
  }
  ASSERT_EQ(stats.size(), 1u);
  const Node& s = c.nodes[static_cast<std::size_t>(stats[0])];
  EXPECT_EQ(s.name, "norm:layer_norm_stats");
  EXPECT_EQ(s.phase, Phase::kForward);
  EXPECT_LT(stats[0], first_backward);
  EXPECT_EQ(s.op.eps, 1e-3);
  EXPECT_EQ(s.spec.shape, (Shape{4, 6, 3}));
  int readers = 0;
  for (const Node& n : c.nodes) {
    if (n.kind != NodeKind::kCompute) continue;
    const bool grad = n.op.type == OpType::kLayerNormGradX || n.op.type == OpType::kLayerNormGradW;
    if (grad) {
      EXPECT_EQ(n.inputs.back(), stats[0]) << n.name;
    }
    readers += grad;
  }
  EXPECT_EQ(readers, 2);  // norm's dx and dw; frozen has neither
  const TaskGraph t = expand_shards(c, {*c.loss});
  for (const DeviceTasks& dt : t.devices) {
    int with_stats = 0;
    for (const Task& task : dt.tasks) {
      const auto* k = std::get_if<ComputeTask>(&task.work);
      if (!k) continue;
      EXPECT_NE(k->call->op.type, OpType::kLayerNormStats) << "a task of its own";
      for (const FusedKernel& f : k->fused) {
        if (f.op.type != OpType::kLayerNormStats) continue;
        ++with_stats;
        EXPECT_EQ(k->call->op.type, OpType::kLayerNorm);
        EXPECT_EQ(task.phase, Phase::kForward);
        EXPECT_EQ(f.local_out, (Shape{2, 6, 3}));
      }
    }
    EXPECT_EQ(with_stats, 1) << "device " << dt.device;
  }
}

// A reshape takes its input's buffer exactly where this device drops the input right after it
// (released by the reshape, not accumulated): the GPT's head reshapes in forward and backward.
TEST(Passes, AReshapeReusesItsInputOnlyWhereItIsTheLastReader) {
  const Model m = load_model(std::filesystem::path(MESHFLOW_EXAMPLES_DIR) / "gpt" / "gpt_dp.json");
  for (int micro : {1, 2}) {
    const Pcg g = compile(m.pcg, Mode::kTrain, {.micro_batches = micro});
    const TaskGraph t = expand_shards(g, {*g.loss});
    int reusing = 0;
    for (const DeviceTasks& dt : t.devices) {
      const std::set<ValueId> accumulated(dt.accumulated.begin(), dt.accumulated.end());
      for (const Task& task : dt.tasks) {
        const auto* c = std::get_if<ComputeTask>(&task.work);
        const bool reshape = c && c->call->op.type == OpType::kReshape;
        const bool last =
            reshape && std::count(task.release.begin(), task.release.end(), c->call->args[0]) == 1;
        EXPECT_EQ(task.reuses_input, last && !accumulated.count(c->call->args[0]))
            << "device " << dt.device << " " << t.names[task.out];
        reusing += task.reuses_input;
      }
    }
    EXPECT_GT(reusing, 0) << micro << " micro-batches";
  }
}

}  // namespace
}  // namespace meshflow
