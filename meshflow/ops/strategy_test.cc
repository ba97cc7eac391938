// Sharding propagation: the golden catalogue of (operator, operand layouts) -> chosen strategy
// and its cost, and the rules the catalogue illustrates checked one by one.
#include "meshflow/ops/strategy.h"

#include <gtest/gtest.h>

#include "meshflow/core/error.h"
#include "meshflow/core/golden.h"

namespace meshflow {
namespace {

Layout L(std::string_view mesh, std::string_view placements, Shape shape,
         DType dtype = DType::kFloat32) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape), dtype);
}

struct Case {
  Op op;
  std::vector<Layout> inputs;
};

std::vector<Case> catalogue() {
  const Op add{.type = OpType::kAdd}, mul{.type = OpType::kMul}, mm{.type = OpType::kMatmul};
  const Op lin{.type = OpType::kLinear};
  return {
      {add, {L("4", "P(sum)", {64, 64}), L("4", "P(sum)", {64, 64})}},
      {add, {L("4", "P(sum)", {64, 64}), L("4", "R", {64, 64})}},
      {add, {L("4", "P(avg)", {64, 64}), L("4", "R", {64, 64})}},
      {add, {L("4", "S(0)", {64, 64}), L("4", "R", {64, 64})}},
      {add, {L("4", "S(0)", {13, 5}), L("4", "S(0)", {13, 5})}},
      {add, {L("4", "S(1)", {8, 64}), L("4", "S(0)", {64})}},
      {add, {L("4", "P(max)", {64, 64}), L("4", "R", {64, 64})}},
      {{.type = OpType::kSub}, {L("4", "R", {64}), L("4", "P(sum)", {64})}},
      {mul, {L("4", "P(sum)", {64, 64}), L("4", "R", {64, 64})}},
      {mul, {L("4", "R", {64, 64}), L("4", "P(sum)", {64, 64})}},
      {mul, {L("4", "P(avg)", {64, 64}), L("4", "R", {64, 64})}},
      {mul, {L("4", "P(sum)", {64, 64}), L("4", "P(sum)", {64, 64})}},
      {{.type = OpType::kDiv}, {L("4", "P(sum)", {64, 64}), L("4", "R", {64, 64})}},
      {{.type = OpType::kNeg}, {L("4", "P(sum)", {64, 64})}},
      {{.type = OpType::kRelu}, {L("4", "P(sum)", {64, 64})}},
      {{.type = OpType::kExp}, {L("4", "P(avg)", {64, 64})}},
      {{.type = OpType::kGelu}, {L("4", "S(1)", {8, 64})}},
      {mm, {L("4", "P(sum)", {64, 32}), L("4", "R", {32, 16})}},
      {mm, {L("4", "R", {64, 32}), L("4", "S(1)", {32, 16})}},
      {mm, {L("4", "S(1)", {64, 32}), L("4", "S(0)", {32, 16})}},
      {mm, {L("4", "S(0)", {2, 64, 32}), L("4", "R", {32, 16})}},
      {lin, {L("4", "S(1)", {64, 32}), L("4", "S(0)", {32, 16}), L("4", "R", {16})}},
      {lin, {L("2x2", "S(0),R", {64, 32}), L("2x2", "R,S(1)", {32, 16})}},
      {lin, {L("2x2", "S(0),S(1)", {64, 32}), L("2x2", "R,S(0)", {32, 16}), L("2x2", "R,R", {16})}},
      {{.type = OpType::kSum, .dims = {0}}, {L("4", "S(0)", {64, 8})}},
      {{.type = OpType::kMean, .dims = {0}}, {L("4", "S(0)", {13, 8})}},
      {{.type = OpType::kMean, .dims = {1}}, {L("4", "S(0)", {13, 8})}},
      {{.type = OpType::kSum, .dims = {1}}, {L("4", "P(sum)", {64, 8})}},
      {{.type = OpType::kSoftmax}, {L("4", "S(1)", {64, 64})}},
      {{.type = OpType::kSoftmax}, {L("4", "S(0)", {64, 64})}},
      {{.type = OpType::kSoftmaxCrossEntropy},
       {L("4", "S(0)", {64, 10}), L("4", "S(0)", {64}, DType::kInt64)}},
      {{.type = OpType::kSoftmaxCrossEntropy},
       {L("4", "S(1)", {64, 10}), L("4", "R", {64}, DType::kInt64)}},
      {{.type = OpType::kSoftmaxCrossEntropy},
       {L("4", "S(1)", {2048, 8192}), L("4", "R", {2048}, DType::kInt64)}},
      {{.type = OpType::kSoftmaxCrossEntropyGrad},
       {L("2x2", "S(0),S(1)", {2048, 8192}), L("2x2", "S(0),R", {2048}, DType::kInt64),
        L("2x2", "R,R", {})}},
      {{.type = OpType::kLogitMax}, {L("4", "S(1)", {64, 10})}},
      {{.type = OpType::kMse}, {L("2x2", "S(0),S(1)", {64, 64}), L("2x2", "S(0),S(1)", {64, 64})}},
      {{.type = OpType::kMse}, {L("4", "P(sum)", {64, 64}), L("4", "R", {64, 64})}},
      {add, {L("2x2", "P(sum),S(0)", {64, 64}), L("2x2", "R,S(0)", {64, 64})}},
      {add, {L("4", "P(sum)", {8}, DType::kInt32), L("4", "R", {8}, DType::kInt32)}},
  };
}

std::string catalogue_text() {
  std::string out;
  for (const Case& c : catalogue()) {
    std::string operands;
    for (const Layout& l : c.inputs)
      operands += fmt::format("{}[{} {} {}]", operands.empty() ? "" : " ", to_string(l.placements),
                              to_string(l.shape), to_string(l.dtype));
    out += fmt::format("{} mesh {}: {}\n    {}\n", to_string(c.op), to_string(c.inputs[0].mesh),
                       operands, to_text(choose_strategy(c.op, c.inputs)));
  }
  return out;
}

TEST(StrategyGolden, CatalogueOfChosenStrategiesAndCosts) {
  const std::string got = catalogue_text();
  EXPECT_EQ(golden_mismatch(got, std::string(MESHFLOW_OPS_TESTDATA) + "/strategy_golden.txt",
                            "strategy_golden.actual.txt"),
            "")
      << got;
}

std::string chosen(const Op& op, const std::vector<Layout>& in) {
  const Strategy s = choose_strategy(op, in);
  std::string t;
  for (const Layout& l : s.inputs) t += to_string(l.placements) + " ";
  return t + "-> " + to_string(s.output.placements);
}

TEST(Strategy, PartialFlowsThroughLinearOperatorsWithoutCommunication) {
  const Layout p = L("4", "P(sum)", {64, 64}), r = L("4", "R", {64, 64});
  const Layout avg = L("4", "P(avg)", {64, 64});
  EXPECT_EQ(chosen({.type = OpType::kAdd}, {p, p}), "P(sum) P(sum) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kAdd}, {p, r}), "P(sum) P(sum) -> P(sum)");  // R divided
  EXPECT_EQ(chosen({.type = OpType::kAdd}, {avg, r}), "P(avg) P(avg) -> P(avg)");
  EXPECT_EQ(chosen({.type = OpType::kMul}, {p, r}), "P(sum) R -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kMul}, {r, p}), "R P(sum) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kMul}, {avg, r}), "P(avg) R -> P(avg)");
  EXPECT_EQ(chosen({.type = OpType::kDiv}, {p, r}), "P(sum) R -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kNeg}, {p}), "P(sum) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kMatmul}, {p, L("4", "R", {64, 8})}), "P(sum) R -> P(sum)");
  EXPECT_EQ(choose_strategy({.type = OpType::kMul}, {p, r}).cost_s, 0);
}

TEST(Strategy, ATargetPricesTheResultsMoveThere) {
  // x[64, 16] R @ w[16, 4] S(0): alone, the contraction's P(sum) result costs only x's local
  // chunk. Pinned to R, its all-reduce (256 elements) costs more than gathering w (64) first.
  // A gradient's preference for R keeps the P(sum): its reduction comes once, after every
  // contribution is summed.
  const Op mm{.type = OpType::kMatmul};
  const std::vector<Layout> in = {L("4", "R", {64, 16}), L("4", "S(0)", {16, 4})};
  const std::vector<Placement> r = parse_placements("R");
  EXPECT_EQ(to_string(choose_strategy(mm, in).output.placements), "P(sum)");
  const Strategy pinned = choose_strategy(mm, in, {}, ResultTarget{.placements = r});
  EXPECT_EQ(to_string(pinned.output.placements), "R");
  EXPECT_EQ(to_string(pinned.inputs[1].placements), "R");
  EXPECT_GT(pinned.cost_s, 0);
  const Strategy preferred =
      choose_strategy(mm, in, {}, ResultTarget{.placements = r, .keep_partial = true});
  EXPECT_EQ(to_string(preferred.output.placements), "P(sum)");
  EXPECT_EQ(preferred.cost_s, choose_strategy(mm, in).cost_s);
  // A target the result cannot reach (Shard -> Partial) prices it out, and a reachable one wins.
  const Strategy partial = choose_strategy(mm, in, {}, ResultTarget{parse_placements("P(sum)")});
  EXPECT_EQ(to_string(partial.output.placements), "P(sum)");
  // The cache keys on the target.
  StrategyCache cache;
  EXPECT_EQ(to_string(cache.get(mm, in)->output.placements), "P(sum)");
  EXPECT_EQ(to_string(cache.get(mm, in, ResultTarget{.placements = r})->output.placements), "R");
}

TEST(Strategy, NonLinearOperatorsAndProductsOfPartialsReduceFirst) {
  const Layout p = L("4", "P(sum)", {64, 64});
  for (OpType t : {OpType::kRelu, OpType::kExp, OpType::kTanh}) {
    const Strategy s = choose_strategy({.type = t}, {p});
    EXPECT_FALSE(s.inputs[0].placements[0].is_partial()) << to_string(t);
  }
  const Strategy s = choose_strategy({.type = OpType::kMul}, {p, p});
  int partial_operands = 0;
  for (const Layout& l : s.inputs) partial_operands += l.placements[0].is_partial();
  EXPECT_EQ(partial_operands, 1);  // one operand is reduced, the other stays a term
}

TEST(Strategy, ShardedReductionsAndContractionsGivePartialSums) {
  EXPECT_EQ(chosen({.type = OpType::kSum, .dims = {0}}, {L("4", "S(0)", {64, 8})}),
            "S(0) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kMean, .dims = {0}}, {L("4", "S(0)", {13, 8})}),
            "S(0) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kMatmul}, {L("4", "S(1)", {64, 32}), L("4", "S(0)", {32, 16})}),
            "S(1) S(0) -> P(sum)");
  EXPECT_EQ(chosen({.type = OpType::kAdd}, {L("4", "S(1)", {8, 64}), L("4", "S(0)", {64})}),
            "S(1) S(0) -> S(1)");
}

TEST(Strategy, SoftmaxGathersItsDimAndKeepsTheBatchSharded) {
  EXPECT_EQ(chosen({.type = OpType::kSoftmax}, {L("4", "S(0)", {64, 64})}), "S(0) -> S(0)");
  const Strategy s = choose_strategy({.type = OpType::kSoftmax}, {L("4", "S(1)", {64, 64})});
  EXPECT_FALSE(s.inputs[0].placements[0] == Placement::shard(1));
}

TEST(Strategy, BadOperandsAreOneErrorNamingTheOperatorAndLayouts) {
  auto message = [](const Op& op, const std::vector<Layout>& in) {
    try {
      choose_strategy(op, in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({.type = OpType::kAdd}, {L("4", "S(0)", {8}), L("2x2", "R,R", {8})}),
            "add: operands are on different meshes (operand 0: mesh 4 placements S(0) shape 8 "
            "float32; operand 1: mesh 2x2 placements R,R shape 8 float32)");
  EXPECT_EQ(message({.type = OpType::kMatmul}, {L("4", "R", {8, 3}), L("4", "R", {4, 2})}),
            "matmul: operand shapes 8x3, 4x2 do not fit a[..., m, k] @ b[k, n] (operand 0: mesh "
            "4 placements R shape 8x3 float32; operand 1: mesh 4 placements R shape 4x2 float32)");
  EXPECT_EQ(message({.type = OpType::kExp}, {L("4", "S(0)", {8}, DType::kInt64)}),
            "exp: operand 0 is int64; exp takes float32 or float64 (operand 0: mesh 4 "
            "placements S(0) shape 8 int64)");
}

}  // namespace
}  // namespace meshflow
