// fold_transposes: a transpose feeding a product becomes the product's BLAS flag, the
// transpose is dropped where nothing else reads it, and the folded graph computes what the
// graph as built computes (the float64 reference, which never folds) forward and backward.
#include <gtest/gtest.h>

#include "meshflow/core/compare.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/reference.h"

namespace meshflow {
namespace {

// h = x[6, 4] @ transpose(w[5, 4]); k = transpose(a[4, 6]) @ v[4, 3]; loss = mse(h, y) +
// mse(k, z), with `kept` also an output (so that transpose stays).
Pcg tied(bool keep_a_transpose) {
  Pcg g;
  const DeviceMesh mesh = parse_mesh("2");
  const auto r = parse_placements("R");
  const ValueId x =
      add_input(g, "x", {{6, 4}}, mesh, parse_placements("S(0)"), Source::normal(1, 1));
  const ValueId y =
      add_input(g, "y", {{6, 5}}, mesh, parse_placements("S(0)"), Source::normal(1, 2));
  const ValueId z = add_input(g, "z", {{6, 3}}, mesh, r, Source::normal(1, 3));
  const ValueId w =
      add_weight(g, "w", {{5, 4}}, mesh, parse_placements("S(0)"), Source::normal(0.5, 4));
  const ValueId a = add_weight(g, "a", {{4, 6}}, mesh, r, Source::normal(0.5, 5));
  const ValueId v = add_weight(g, "v", {{4, 3}}, mesh, r, Source::normal(0.5, 6));
  const ValueId wt = add_compute(g, "wt", Op{.type = OpType::kTranspose}, {w});
  const ValueId at = add_compute(g, "at", Op{.type = OpType::kTranspose, .dims = {1, 0}}, {a});
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kMatmul}, {x, wt});
  const ValueId k = add_compute(g, "k", Op{.type = OpType::kMatmul}, {at, v});
  const ValueId l1 = add_compute(g, "l1", Op{.type = OpType::kMse}, {h, y});
  const ValueId l2 = add_compute(g, "l2", Op{.type = OpType::kMse}, {k, z});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kAdd}, {l1, l2}));
  if (keep_a_transpose) g.outputs.push_back(at);
  return g;
}

const Node& node(const Pcg& g, const std::string& name) {
  return g.nodes[static_cast<std::size_t>(find_value(g, name))];
}

TEST(FoldTransposes, ProductsReadTheTransposedValueThroughTheFlag) {
  const Pcg folded = fold_transposes(tied(false));
  EXPECT_EQ(node(folded, "h").op.type, OpType::kMatmulGradA);
  EXPECT_EQ(node(folded, "h").inputs[1], find_value(folded, "w"));
  EXPECT_EQ(node(folded, "k").op.type, OpType::kMatmulGradB);
  EXPECT_EQ(node(folded, "k").inputs[0], find_value(folded, "a"));
  EXPECT_FALSE(folded.names.contains("wt"));
  EXPECT_FALSE(folded.names.contains("at"));
  for (const Node& n : folded.nodes) EXPECT_NE(n.op.type, OpType::kTranspose) << n.name;
  // A transpose that is also an output stays (its product still reads through the flag).
  const Pcg kept = fold_transposes(tied(true));
  EXPECT_EQ(node(kept, "k").op.type, OpType::kMatmulGradB);
  EXPECT_EQ(node(kept, "at").op.type, OpType::kTranspose);
  EXPECT_FALSE(kept.names.contains("wt"));
  // A laid-out graph is left as it is.
  const Pcg laid_out = infer_layouts(tied(false));
  EXPECT_EQ(fold_transposes(laid_out), laid_out);
}

TEST(FoldTransposes, TheFoldedGraphComputesWhatTheBuiltOneDoes) {
  const Pcg built = tied(false);
  const Pcg folded = fold_transposes(built);
  ReferenceModel a = reference_load(built), b = reference_load(folded);
  reference_forward(a);
  reference_forward(b);
  for (const char* name : {"h", "k", "loss"}) {
    const auto diff =
        compare_close(b.values[static_cast<std::size_t>(find_value(folded, name))],
                      a.values[static_cast<std::size_t>(find_value(built, name))], 1e-6, 1e-7);
    EXPECT_FALSE(diff) << name << ": " << *diff;
  }
  const auto ga = reference_gradients(a), gb = reference_gradients(b);
  for (const char* name : {"w", "a", "v"}) {
    ASSERT_TRUE(ga.contains(name) && gb.contains(name)) << name;
    const auto diff = compare_close(gb.at(name), ga.at(name), 1e-6, 1e-7);
    EXPECT_FALSE(diff) << "gradient of " << name << ": " << *diff;
  }
  // And it compiles for training: the products' gradients are products again.
  const Pcg trained = compile(built, Mode::kTrain);
  for (const Node& n : trained.nodes) EXPECT_NE(n.op.type, OpType::kTranspose) << n.name;
}

}  // namespace
}  // namespace meshflow
