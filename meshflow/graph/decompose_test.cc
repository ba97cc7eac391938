// decompose_collectives (--overlap): which products it decomposes and which it leaves, the
// invariants verify keeps, the task graph it expands into and what explain lists (its golden
// text is in passes_test.cc).
#include <gtest/gtest.h>

#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/graph/testing.h"

namespace meshflow {
namespace {

// Compiled for training; with `overlap`, every collective the patterns allow is decomposed
// (these graphs are too small for the cost model to choose a loop).
Pcg compiled(const Pcg& built, bool overlap) {
  return compile(built, Mode::kTrain, {.overlap = overlap, .decompose = {.always = true}});
}

// Returns "node: kind on mesh dim d (form)" for every decomposed node.
std::vector<std::string> decompositions(const Pcg& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes) {
    if (!n.decomposed) continue;
    const bool gather = n.decomposed->kind == Decomposition::Kind::kGatherOperand;
    out.push_back(n.name + (gather ? ": gather " : ": scatter ") +
                  g.nodes[static_cast<std::size_t>(n.decomposed->move)].name + " on dim " +
                  std::to_string(n.decomposed->mesh_dim) + " (" +
                  std::string(to_string(n.decomposed->form)) + ")");
  }
  return out;
}

TEST(Decompose, GathersIntoAndScattersOutOfTheSequenceParallelProducts) {
  for (int dp : {1, 2}) {
    for (int tp : {2, 3, 4, 8}) {
      const Pcg g = compiled(testing::sp_mlp(dp, tp, 2 * tp + 1, 5, 4 * tp), /*overlap=*/true);
      const std::string on = " on dim " + std::to_string(dp == 1 ? 0 : 1);
      // Forward: the column-parallel linear's gather and the row-parallel matmul's scatter;
      // backward: the gather of o's gradient into the row-parallel product's gradient, and
      // the scatter of th's gradient (a partial sum, th being replicated) out of h's.
      EXPECT_EQ(decompositions(g), (std::vector<std::string>{
                                       "h: gather move:th@h" + on + " (permute)",
                                       "o:kernel: scatter o" + on + " (permute)",
                                       "bwd:o/0: gather move:grad:o@bwd:o/0" + on + " (permute)",
                                       "bwd:h/0: scatter move:grad:th@bwd:th/0" + on + " (permute)",
                                   }))
          << "dp " << dp << ", tp " << tp;
    }
  }
}

TEST(Decompose, WithoutOverlapNothingIsDecomposedAndTheRestIsTheSame) {
  Pcg plain = compiled(testing::sp_mlp(1, 4), false);
  Pcg overlapped = compiled(testing::sp_mlp(1, 4), true);
  EXPECT_TRUE(decompositions(plain).empty());
  for (Node& n : overlapped.nodes) n.decomposed = std::nullopt;
  EXPECT_EQ(plain, overlapped);
}

TEST(Decompose, LeavesWhatItCannotRunAsALoop) {
  // DESIGN's DP x TP MLP replicates x over tp (no gather) and all-reduces o (no scatter); its
  // gradients' reductions are all-reduces of products that are weights' gradients.
  EXPECT_TRUE(decompositions(compiled(testing::dp_tp_mlp("labels.npy"), true)).empty());
  // A reported value is never left unmade: pinning o's kernel result as an output keeps it.
  Pcg g = testing::sp_mlp(1, 4);
  g.nodes[static_cast<std::size_t>(find_value(g, "o"))].placements = std::nullopt;
  const Pcg c = compiled(g, true);
  for (const std::string& d : decompositions(c)) EXPECT_EQ(d.find("scatter o "), std::string::npos);
}

TEST(Decompose, VerifyRejectsADecompositionItsPatternDoesNotAllow) {
  Pcg g = compiled(testing::sp_mlp(1, 4), true);
  // Mark the first matmul (e: x is already row-sharded, nothing gathered) as a gather.
  Node& e = g.nodes[static_cast<std::size_t>(find_value(g, "e"))];
  e.decomposed = Decomposition{.kind = Decomposition::Kind::kGatherOperand, .move = e.inputs[0]};
  EXPECT_THROW(verify(g, Stage::kCopied), Error);
}

TEST(Decompose, ExplainListsNMinus1PermutesPerGatherAndNamesTheProduct) {
  for (int tp : {2, 3, 4, 8}) {
    const Explanation e = explain(compiled(testing::sp_mlp(1, tp, 2 * tp + 1, 5, 4 * tp), true));
    int decomposed = 0;
    for (const MoveReport& m : e.moves) {
      if (m.overlapped_with.empty()) continue;
      ++decomposed;
      EXPECT_EQ(m.steps,
                std::vector<StepKind>(static_cast<std::size_t>(tp - 1), StepKind::kPermute))
          << m.value << " for " << m.consumer;
    }
    EXPECT_EQ(decomposed, 4) << tp << " devices";
  }
}

TEST(Decompose, DevicesSharingMemoryReadGatheredBlocksInPlaceAndAFormMayBeNamed) {
  const Pcg built = testing::sp_mlp(1, 4, 9, 5, 16);  // gathers into h and bwd:o/0
  auto forms = [&](const DecomposeOptions& d) {
    DecomposeOptions always = d;
    always.always = true;
    const Pcg g = compile(built, Mode::kTrain, {.overlap = true, .decompose = always});
    std::vector<std::string> out;
    for (const Node& n : g.nodes) {
      if (n.decomposed && n.decomposed->kind == Decomposition::Kind::kGatherOperand)
        out.emplace_back(to_string(n.decomposed->form));
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(forms({.shared_memory = true}), (V{"in_place", "in_place"}));
  EXPECT_EQ(forms({.shared_memory = true, .gather_form = GatherForm::kBroadcast}),
            (V{"broadcast", "broadcast"}));
  EXPECT_EQ(forms({.gather_form = GatherForm::kBroadcast}), (V{"broadcast", "broadcast"}));
  EXPECT_THROW(forms({.gather_form = GatherForm::kInPlace}), Error);
  // explain lists the in-place gather as one step.
  const Explanation e =
      explain(compile(built, Mode::kTrain,
                      {.overlap = true, .decompose = {.shared_memory = true, .always = true}}));
  for (const MoveReport& m : e.moves) {
    if (m.overlapped_with == "h") {
      EXPECT_EQ(m.steps, std::vector{StepKind::kInPlace});
    }
  }
}

// Without `always`, a collective is decomposed only where the cost model's loop is shorter than
// the collective then the product; explain says why the others were kept whole.
TEST(Decompose, TheCostModelDecomposesOnlyWhereTheLoopIsShorter) {
  const Pcg built = testing::sp_mlp(1, 4, 64, 32, 64);
  auto decomposed = [&](const MachineModel& m, bool shared_memory) {
    const PlanOptions plan{.machine = &m};
    return decompositions(
        compile(built, Mode::kTrain,
                {.plan = plan, .overlap = true, .decompose = {.shared_memory = shared_memory}}));
  };
  // The built-in machine: microseconds of latency against sub-microsecond products.
  EXPECT_TRUE(decomposed(default_machine(), false).empty());
  const PlanOptions plan;
  const DecomposeOptions options;
  const Explanation e =
      explain(compile(built, Mode::kTrain, {.plan = plan, .overlap = true}), plan, &options);
  int kept = 0;
  for (const MoveReport& m : e.moves) {
    if (!m.kept_whole) continue;
    ++kept;
    EXPECT_GE(m.kept_whole->overlapped_s, m.kept_whole->sequential_s) << m.value;
  }
  EXPECT_EQ(kept, 4);
  EXPECT_NE(to_text(e).find("kept whole: loop est"), std::string::npos) << to_text(e);
  // Slow links and slow products that run beside each other: every loop hides its transfers.
  MachineModel slow{.links = {{"l", LinkClass{.bandwidth_gbps = 0.001, .latency_us = 0}}},
                    .default_link = "l",
                    .memcpy_gbps = 1,
                    .collective_overhead_us = 0,
                    .local_step_us = 0,
                    .gemm_gflops = 0.001,
                    .elementwise_gbps = 1};
  EXPECT_EQ(decomposed(slow, false).size(), 4u);
  // The same links copying on the cores that compute: a loop only adds each product call's
  // packing to the same copies, so nothing is decomposed, but where devices share memory the
  // loops read and add blocks in place and copy nothing.
  slow.links["l"].copies_on_cores = true;
  EXPECT_TRUE(decomposed(slow, false).empty());
  EXPECT_EQ(
      decomposed(slow, true),
      (std::vector<std::string>{"h: gather move:th@h on dim 0 (in_place)",
                                "o:kernel: scatter o on dim 0 (in_place)",
                                "bwd:o/0: gather move:grad:o@bwd:o/0 on dim 0 (in_place)",
                                "bwd:h/0: scatter move:grad:th@bwd:th/0 on dim 0 (in_place)"}));
}

TEST(Decompose, TheLoopMakesTheGatheredOperandAndEveryValueIsReleased) {
  const Pcg g = compiled(testing::sp_mlp(2, 2), true);
  const TaskGraph t = expand_shards(g, {});
  ValueId gathered = -1;
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == "move:th@h") gathered = static_cast<ValueId>(i);
  ASSERT_GE(gathered, 0);
  for (const DeviceTasks& dt : t.devices) {
    std::set<ValueId> made, released;
    for (const Task& task : dt.tasks) {
      made.insert(task.out);
      EXPECT_NE(task.out, gathered) << "the gather has no task of its own";
      if (const auto* o = std::get_if<OverlapTask>(&task.work)) {
        if (o->decomposition.kind == Decomposition::Kind::kGatherOperand)
          made.insert(o->call->args[0]);
        EXPECT_EQ(o->group.size(), 2u);
      }
      released.insert(task.release.begin(), task.release.end());
    }
    EXPECT_TRUE(made.count(gathered));
    for (ValueId v : made) {
      const Node& n = g.nodes[static_cast<std::size_t>(v)];
      if (n.kind == NodeKind::kUpdate) continue;
      EXPECT_TRUE(released.count(v)) << "device " << dt.device << " keeps " << n.name;
    }
  }
}

}  // namespace
}  // namespace meshflow
