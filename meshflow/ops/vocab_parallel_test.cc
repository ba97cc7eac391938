// The vocabulary-parallel cross-entropy: the lowering's steps as golden text, and the steps run
// shard by shard (each move done by gather-then-reshard, independent of the planner) against the
// whole-tensor loss and gradient, on meshes (4) and (2,2), with uneven and empty class shards;
// its strategies priced on meshes with a dim of one device.
#include "meshflow/ops/vocab_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/ops/strategy.h"

namespace meshflow {
namespace {

Layout L(std::string_view mesh, std::string_view placements, Shape shape,
         DType dtype = DType::kFloat32) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape), dtype);
}

std::string steps_text(const Lowering& low) {
  std::string out;
  for (const LoweredStep& s : low.steps) {
    out += fmt::format("{}({}): {} -> pin {}\n", to_string(s.op), fmt::join(s.args, ","),
                       to_text(s.strategy), to_string(s.layout.placements));
  }
  return out;
}

TEST(VocabParallel, LoweringAllReducesTheRowStatisticsOnly) {
  const Op ce{.type = OpType::kSoftmaxCrossEntropy};
  const Layout logits = L("4", "S(1)", {2048, 8192});
  const Layout labels = L("4", "R", {2048}, DType::kInt64);
  ASSERT_TRUE(needs_lowering(ce, {logits, labels}));
  EXPECT_FALSE(needs_lowering(ce, {L("4", "S(0)", {2048, 8192}), labels}));
  // S(1) over one device is the whole class dim.
  EXPECT_FALSE(needs_lowering(
      ce, {L("1x4", "S(1),S(0)", {2048, 8192}), L("1x4", "R,S(0)", {2048}, DType::kInt64)}));
  const Lowering low = lower(ce, {logits, labels});
  EXPECT_EQ(steps_text(low),
            "logit_max(0): S(1) -> P(max)  cost 5.12e-05 s -> pin R\n"
            "logit_stats(0,2,1): S(1) + R + R -> P(sum)  cost 5.44e-05 s -> pin R\n"
            "cross_entropy_from_stats(2,3): R + R -> R  cost 0 s -> pin R\n");
  // On 2x2 with the rows sharded too, the statistics keep the row shard.
  const Op grad{.type = OpType::kSoftmaxCrossEntropyGrad};
  const Lowering low2 =
      lower(grad, {L("2x2", "S(0),S(1)", {2048, 8192}), L("2x2", "S(0),R", {2048}, DType::kInt64),
                   L("2x2", "R,R", {})});
  EXPECT_EQ(steps_text(low2),
            "logit_max(0): S(0),S(1) -> S(0),P(max)  cost 4.35e-05 s -> pin S(0),R\n"
            "logit_stats(0,3,1): S(0),S(1) + S(0),R + S(0),R -> S(0),P(sum)  cost 4.5e-05 s -> "
            "pin S(0),R\n"
            "cross_entropy_grad_from_stats(0,1,3,4,2): S(0),S(1) + S(0),R + S(0),R + S(0),R + "
            "R,R -> S(0),S(1)  cost 0 s -> pin S(0),S(1)\n");
}

TEST(VocabParallel, ChosenWhenCheaperThanGatheringTheLogits) {
  const Op ce{.type = OpType::kSoftmaxCrossEntropy};
  const Layout labels = L("4", "R", {2048}, DType::kInt64);
  const Strategy big = choose_strategy(ce, {L("4", "S(1)", {2048, 8192}), labels});
  EXPECT_EQ(to_string(big.inputs[0].placements), "S(1)");
  const Lowering low = lower(ce, big.inputs);
  EXPECT_DOUBLE_EQ(big.cost_s, low.cost_s);  // no operand moves: the steps' all-reduces alone
  // Ten classes a row: one all-gather of the logits is cheaper than two all-reduces.
  const Strategy small =
      choose_strategy(ce, {L("4", "S(1)", {64, 10}), L("4", "R", {64}, DType::kInt64)});
  EXPECT_EQ(to_string(small.inputs[0].placements), "R");
}

// On a mesh with a dim of one device (2x1, 1x4), every strategy of the loss and its gradient is
// priced, the lowered ones among them, though their steps may end in R where the strategy says
// P(sum) over that one device (the same numbers); autoshard enumerates all of them.
TEST(VocabParallel, StrategiesOnAMeshWithADimOfOneDevice) {
  for (const std::string_view mesh : {"2x1", "1x4"}) {
    const Layout logits = L(mesh, "S(1),S(1)", {64, 40});
    const Layout labels = L(mesh, "R,R", {64}, DType::kInt64);
    const Layout scale = L(mesh, "R,R", {});
    ASSERT_TRUE(needs_lowering({.type = OpType::kSoftmaxCrossEntropy}, {logits, labels}));
    for (const OpType type : {OpType::kSoftmaxCrossEntropy, OpType::kSoftmaxCrossEntropyGrad}) {
      const Op op{.type = type};
      std::vector<Layout> in = {logits, labels};
      if (op.type == OpType::kSoftmaxCrossEntropyGrad) in.push_back(scale);
      const std::vector<Strategy> all = strategies(op, in);
      EXPECT_TRUE(std::any_of(all.begin(), all.end(),
                              [&](const Strategy& s) { return needs_lowering(op, s.inputs); }))
          << mesh << " " << to_string(op);
    }
  }
}

// Moves `shards` (laid out as `from`) to `to` by assembling the whole tensor and cutting it
// again: the reference every move here is made with.
std::vector<Tensor> reshard(const std::vector<Tensor>& shards, const Layout& from,
                            const Layout& to) {
  if (from != to) return shard_tensor(assemble(from, shards), to);
  std::vector<Tensor> copy;
  for (const Tensor& t : shards) copy.push_back(t.clone());
  return copy;
}

// Runs `low` device by device on operands laid out as `layouts`; returns the result's shards.
std::vector<Tensor> run_lowered(const Lowering& low, const std::vector<Layout>& layouts,
                                const std::vector<const Tensor*>& operands) {
  std::vector<Layout> value_layouts = layouts;
  std::vector<std::vector<Tensor>> values;
  for (std::size_t i = 0; i < operands.size(); ++i)
    values.push_back(shard_tensor(*operands[i], layouts[i]));
  const DeviceMesh& mesh = layouts[0].mesh;
  for (const LoweredStep& s : low.steps) {
    std::vector<std::vector<Tensor>> args;
    std::vector<TensorSpec> globals;
    for (std::size_t k = 0; k < s.args.size(); ++k) {
      const auto a = static_cast<std::size_t>(s.args[k]);
      args.push_back(reshard(values[a], value_layouts[a], s.strategy.inputs[k]));
      globals.push_back({value_layouts[a].shape, value_layouts[a].dtype});
    }
    std::vector<Tensor> out;
    for (std::size_t d = 0; d < mesh.devices.size(); ++d) {
      std::vector<const Tensor*> locals;
      ShardOffsets offsets;
      for (std::size_t k = 0; k < args.size(); ++k) {
        locals.push_back(&args[k][d]);
        offsets.push_back(shard_box(s.strategy.inputs[k], mesh.devices[d]).offset);
      }
      out.push_back(run_kernel(s.op, locals, globals, offsets));
    }
    values.push_back(reshard(out, s.strategy.output, s.layout));
    value_layouts.push_back(s.layout);
  }
  return std::move(values.back());
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.numel()); ++i)
    d = std::max(d, std::abs(a.data<double>()[i] - b.data<double>()[i]));
  return d;
}

TEST(VocabParallel, LoweredStepsEqualTheWholeLossAndGradient) {
  struct Case {
    std::string_view mesh, logits, labels;
    Shape shape;
  };
  // 10 classes over 4 are 3,3,3,1; 3 over 4 leave one device without classes; 7 rows over 2.
  for (const Case& c :
       {Case{"4", "S(1)", "R", {6, 10}}, Case{"4", "S(1)", "R", {5, 3}},
        Case{"2x2", "S(0),S(1)", "S(0),R", {7, 9}}, Case{"2x2", "S(1),S(0)", "R,S(0)", {8, 5}}}) {
    SCOPED_TRACE(fmt::format("mesh {} logits {} {}", c.mesh, c.logits, to_string(c.shape)));
    const Tensor logits = random_tensor(DType::kFloat64, c.shape, 7);
    Tensor labels(DType::kInt64, {c.shape[0]});
    for (std::int64_t r = 0; r < c.shape[0]; ++r)
      labels.data<std::int64_t>()[static_cast<std::size_t>(r)] = (5 * r + 2) % c.shape[1];
    Tensor g(DType::kFloat64, {});
    g.data<double>()[0] = 0.75;
    const std::vector<Layout> layouts = {
        L(c.mesh, c.logits, c.shape, DType::kFloat64),
        L(c.mesh, c.labels, {c.shape[0]}, DType::kInt64),
        L(c.mesh, c.mesh == "4" ? "R" : "R,R", {}, DType::kFloat64)};
    const Op ce{.type = OpType::kSoftmaxCrossEntropy};
    const std::vector<Layout> two(layouts.begin(), layouts.begin() + 2);
    const Lowering forward = lower(ce, two);
    const Tensor loss =
        assemble(forward.steps.back().layout, run_lowered(forward, two, {&logits, &labels}));
    EXPECT_LT(max_diff(loss, compute(ce, {&logits, &labels})), 1e-12);
    const Op grad{.type = OpType::kSoftmaxCrossEntropyGrad};
    const Lowering backward = lower(grad, layouts);
    const Tensor dlogits = assemble(backward.steps.back().layout,
                                    run_lowered(backward, layouts, {&logits, &labels, &g}));
    EXPECT_LT(max_diff(dlogits, compute(grad, {&logits, &labels, &g})), 1e-12);
  }
}

TEST(VocabParallel, ALabelOutsideTheClassesIsOneErrorOnEveryShard) {
  const Tensor logits = random_tensor(DType::kFloat32, {2, 4}, 3);
  Tensor m(DType::kFloat32, {2});
  Tensor labels(DType::kInt32, {2});
  labels.data<std::int32_t>()[1] = 9;
  const std::vector<TensorSpec> globals = {{{2, 8}, DType::kFloat32}, spec_of(m), spec_of(labels)};
  for (std::int64_t first : {0, 4}) {  // the shard that would hold class 9 and one that would not
    try {
      run_kernel({.type = OpType::kLogitStats}, {&logits, &m, &labels}, globals,
                 {{0, first}, {0}, {0}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(),
                   "softmax_cross_entropy: label 9 (row 1 of this shard) is outside [0, 8)");
    }
  }
}

}  // namespace
}  // namespace meshflow
