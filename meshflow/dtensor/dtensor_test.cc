// The DTensor API on the threads backend: every operator, forward and backward, on random
// layouts (uneven and empty shards, Partial operands with random terms) of meshes (4) and (2,2),
// against the single-device result; the partial-propagation rules with their communication
// counted by the recording Communicator; and the user-facing errors.
#include "meshflow/dtensor/dtensor.h"

#include <gtest/gtest.h>

#include <functional>

#include "meshflow/comm/launch.h"
#include "meshflow/comm/recording.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/golden.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/ops/strategy.h"
#include "tests/dtensor_check.h"

namespace meshflow {
namespace {

using testing::random_shards;

TEST(DTensorOperators, EveryOperatorMatchesTheSingleDeviceResultForwardAndBackward) {
  testing::check_every_operator(Backend::kThreads, 4);
}

// Runs fn on every device of mesh with a recording communicator around the threads one, and
// returns device 0's log of fn's calls (full_tensor afterwards is not counted).
struct Counted {
  CallLog calls;
  std::vector<Placement> placements;
};

Tensor global_of(const Layout& layout, std::uint64_t seed, std::vector<std::vector<Tensor>>& keep) {
  keep.push_back(random_shards(layout, seed));
  return assemble(layout, keep.back());
}

Counted run_counted(const std::vector<Layout>& layouts,
                    const std::function<DTensor(const std::vector<const DTensor*>&)>& fn,
                    const std::function<Tensor(const std::vector<const Tensor*>&)>& reference) {
  std::vector<std::vector<Tensor>> shards;
  std::vector<Tensor> globals;
  for (std::size_t i = 0; i < layouts.size(); ++i)
    globals.push_back(global_of(layouts[i], 300 + i, shards));
  std::vector<const Tensor*> gp;
  for (const Tensor& g : globals) gp.push_back(&g);
  const Tensor want = reference(gp);
  const DeviceMesh& mesh = layouts[0].mesh;
  Counted result;
  std::mutex mu;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    auto log = std::make_shared<CallLog>();
    RecordingCommunicator recording(comm.devices(), comm.device(), log, comm.group(comm.devices()));
    const auto index = static_cast<std::size_t>(*find_device(mesh, comm.device()));
    std::vector<DTensor> in;
    std::vector<const DTensor*> ptrs;
    for (std::size_t i = 0; i < layouts.size(); ++i)
      in.push_back(from_local(recording, shards[i][index].clone(), mesh, layouts[i].placements,
                              layouts[i].shape));
    for (const DTensor& t : in) ptrs.push_back(&t);
    const DTensor y = fn(ptrs);
    const CallLog calls = *log;
    EXPECT_EQ(compare_close(full_tensor(y), want, 1e-9, 1e-9), std::nullopt);
    if (comm.device() == 0) {
      std::lock_guard lock(mu);
      result = {calls, y.layout.placements};
    }
  });
  return result;
}

Layout L(std::string_view mesh, std::string_view placements, Shape shape) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape),
                     DType::kFloat64);
}

Counted counted_op(const Op& op, const std::vector<Layout>& layouts) {
  return run_counted(
      layouts, [&](const std::vector<const DTensor*>& in) { return apply_op(op, in); },
      [&](const std::vector<const Tensor*>& in) { return compute(op, in); });
}

Counted counted_op(OpType type, const std::vector<Layout>& layouts) {
  return counted_op(Op{.type = type}, layouts);
}

std::string kinds(const CallLog& log) {
  std::string s;
  for (const RecordedCall& c : log) s += (s.empty() ? "" : " ") + c.collective;
  return s.empty() ? "none" : s;
}

TEST(DTensorPartial, LinearOperatorsKeepPartialWithoutCommunication) {
  const Layout p = L("4", "P(sum)", {8, 6}), r = L("4", "R", {8, 6}),
               avg = L("4", "P(avg)", {8, 6});
  struct Row {
    OpType op;
    std::vector<Layout> in;
    std::string placements;
  };
  const std::vector<Row> rows = {
      {OpType::kAdd, {p, p}, "P(sum)"},
      {OpType::kAdd, {p, r}, "P(sum)"},
      {OpType::kAdd, {avg, r}, "P(avg)"},
      {OpType::kSub, {r, p}, "P(sum)"},
      {OpType::kMul, {p, r}, "P(sum)"},
      {OpType::kMul, {r, p}, "P(sum)"},
      {OpType::kMul, {avg, r}, "P(avg)"},
      {OpType::kDiv, {p, r}, "P(sum)"},
      {OpType::kNeg, {p}, "P(sum)"},
      {OpType::kNeg, {avg}, "P(avg)"},
      {OpType::kMatmul, {p, L("4", "R", {6, 5})}, "P(sum)"},
  };
  for (const Row& row : rows) {
    std::vector<Layout> in = row.in;
    if (row.op == OpType::kDiv) in[1] = r;  // denominators stay away from 0 below
    const Counted c =
        row.op == OpType::kDiv
            ? run_counted(
                  in, [](const std::vector<const DTensor*>& x) { return div(*x[0], *x[1]); },
                  [](const std::vector<const Tensor*>& x) {
                    return compute({.type = OpType::kDiv}, x);
                  })
            : counted_op(row.op, in);
    EXPECT_EQ(kinds(c.calls), "none") << to_string(row.op);
    EXPECT_EQ(to_string(c.placements), row.placements) << to_string(row.op);
  }
}

TEST(DTensorPartial, ProductsOfPartialsAndNonLinearOperatorsReduceFirst) {
  const Layout p = L("4", "P(sum)", {8, 6}), avg = L("4", "P(avg)", {8, 6});
  // One reduction is one call: an all-reduce or reduce-scatter, or (the planner's choice for
  // small tensors) one exchange whose receiver reduces the terms.
  const Counted pp = counted_op(OpType::kMul, {p, p});
  EXPECT_EQ(pp.calls.size(), 1u) << kinds(pp.calls);
  EXPECT_EQ(to_string(pp.placements), "P(sum)");
  for (const auto& [type, in] :
       std::vector<std::pair<OpType, Layout>>{{OpType::kRelu, p}, {OpType::kExp, avg}}) {
    const Counted c = counted_op(type, {in});
    EXPECT_EQ(c.calls.size(), 1u) << to_string(type) << ": " << kinds(c.calls);
    EXPECT_FALSE(c.placements[0].is_partial());
  }
  // With tensors large enough that bandwidth dominates, the reduction is a reducing collective.
  const Layout big = L("4", "P(sum)", {256, 256});
  const Counted c = counted_op(OpType::kRelu, {big});
  ASSERT_EQ(c.calls.size(), 1u) << kinds(c.calls);
  EXPECT_TRUE(c.calls[0].op.has_value()) << kinds(c.calls);
}

TEST(DTensorPartial, ColumnThenRowParallelLinearNeedsExactlyOneReduction) {
  const Layout x = L("4", "R", {64, 32}), w1 = L("4", "S(1)", {32, 128}),
               w2 = L("4", "S(0)", {128, 32});
  const Counted c = run_counted(
      {x, w1, w2},
      [](const std::vector<const DTensor*>& in) {
        const DTensor h = relu(linear(*in[0], *in[1]));
        return redistribute(linear(h, *in[2]), {Placement::replicate()});
      },
      [](const std::vector<const Tensor*>& in) {
        const Tensor h = compute({.type = OpType::kLinear}, {in[0], in[1]});
        const Tensor a = compute({.type = OpType::kRelu}, {&h});
        return compute({.type = OpType::kLinear}, {&a, in[2]});
      });
  EXPECT_EQ(c.calls.size(), 1u) << kinds(c.calls);
}

// Views on sharded tensors: each case runs on threads against the single-device view, and the
// strategy chosen and device 0's communication must be what testdata/view_golden.txt says. Small
// tensors gather where the cost model's latency favours it; large ones take the cheapest layout
// where the view is exact.
TEST(DTensorViews, CatalogueOfViewsMovesWhatTheGoldenFileSays) {
  auto reshape = [](Shape shape) {
    return Op{.type = OpType::kReshape, .shape = std::move(shape)};
  };
  auto transpose = [](std::vector<int> dims) {
    return Op{.type = OpType::kTranspose, .dims = std::move(dims)};
  };
  const std::vector<std::pair<Op, Layout>> cases = {
      // DTensor's wrong result (pytorch#179502): S(1) does not map, S(0) does
      {reshape({16, 6}), L("4", "S(1)", {12, 8})},
      {reshape({16, 6}), L("4", "S(0)", {12, 8})},
      {reshape({1024, 48}), L("4", "S(1)", {768, 64})},
      // a split of a sharded dim: heads divisible by the mesh keep the shard, no movement
      {reshape({4, 6, 4, 4}), L("4", "S(2)", {4, 6, 16})},
      {reshape({4, 6, 2, 8}), L("4", "S(2)", {4, 6, 16})},
      {reshape({64, 16, 2, 64}), L("4", "S(2)", {64, 16, 128})},
      // uneven and empty shards
      {reshape({10, 2, 3}), L("4", "S(0)", {10, 6})},
      {reshape({60}), L("4", "S(0)", {10, 6})},
      {reshape({2, 2, 2}), L("4", "S(0)", {2, 4})},
      {reshape({12}), L("4", "S(0)", {3, 4})},
      // merges of two sharded dims and of a sharded head dim
      {reshape({24, 8}), L("2x2", "S(0),S(1)", {4, 6, 8})},
      {reshape({4, 6, 16}), L("2x2", "S(0),S(2)", {4, 6, 4, 4})},
      {reshape({-1}), L("2x2", "S(0),S(1)", {4, 4})},
      // size-1 dims, Partial
      {reshape({12}), L("4", "S(1)", {1, 12})},
      {reshape({3, 1, 8}), L("4", "P(sum)", {24})},
      // transposes relabel placements
      {transpose({1, 0}), L("4", "S(0)", {6, 5})},
      {transpose({2, 0, 1}), L("2x2", "S(0),S(1)", {4, 6, 8})},
      {transpose({}), L("2x2", "P(sum),S(1)", {4, 6})},
  };
  std::string got;
  for (const auto& [op, in] : cases) {
    const Counted c = counted_op(op, {in});
    const Strategy s = choose_strategy(op, {in});
    got +=
        fmt::format("{} mesh {}: {} {} -> {} {}  (reads {})\n", to_string(op), to_string(in.mesh),
                    to_string(in.placements), to_string(in.shape), to_string(c.placements),
                    to_string(s.output.shape), to_string(s.inputs[0].placements));
    for (const RecordedCall& call : c.calls) got += "    " + to_string(call) + "\n";
    if (c.calls.empty()) got += "    no communication\n";
  }
  EXPECT_EQ(golden_mismatch(got, std::string(MESHFLOW_DTENSOR_TESTDATA) + "/view_golden.txt",
                            "view_golden.actual.txt"),
            "")
      << got;
}

TEST(DTensorEmbedding, VocabularyShardedTableGivesPartialSumWithoutCommunication) {
  Layout ids = L("4", "R", {3, 5});
  ids.dtype = DType::kInt64;
  const Layout table = L("4", "S(0)", {10, 6});
  // random_shards draws any int64: both sides take the ids modulo the vocabulary
  const Op op{.type = OpType::kEmbedding};
  const Counted c = run_counted(
      {ids, table},
      [&](const std::vector<const DTensor*>& in) {
        Tensor local = in[0]->local.clone();
        for (std::int64_t& x : local.data<std::int64_t>()) x = ((x % 10) + 10) % 10;
        const DTensor fixed{std::move(local), in[0]->layout, in[0]->comm};
        return apply_op(op, {&fixed, in[1]});
      },
      [&](const std::vector<const Tensor*>& in) {
        Tensor fixed = in[0]->clone();
        for (std::int64_t& x : fixed.data<std::int64_t>()) x = ((x % 10) + 10) % 10;
        return compute(op, {&fixed, in[1]});
      });
  EXPECT_EQ(kinds(c.calls), "none");
  EXPECT_EQ(to_string(c.placements), "P(sum)");
}

TEST(DTensorLoss, VocabularyShardedLogitsAllReduceRowStatisticsNotTheLogits) {
  Layout labels = L("4", "R", {512});
  labels.dtype = DType::kInt64;
  const std::int64_t classes = 2051;  // uneven class shards
  auto in_range = [&](Tensor t) {
    for (std::int64_t& x : t.data<std::int64_t>()) x = ((x % classes) + classes) % classes;
    return t;
  };
  for (OpType type : {OpType::kSoftmaxCrossEntropy, OpType::kSoftmaxCrossEntropyGrad}) {
    const Op op{.type = type};
    std::vector<Layout> layouts = {L("4", "S(1)", {512, classes}), labels};
    if (type == OpType::kSoftmaxCrossEntropyGrad) layouts.push_back(L("4", "R", {}));
    const Counted c = run_counted(
        layouts,
        [&](const std::vector<const DTensor*>& in) {
          const DTensor fixed{in_range(in[1]->local.clone()), in[1]->layout, in[1]->comm};
          std::vector<const DTensor*> args = in;
          args[1] = &fixed;
          return apply_op(op, args);
        },
        [&](const std::vector<const Tensor*>& in) {
          const Tensor fixed = in_range(in[1]->clone());
          std::vector<const Tensor*> args = in;
          args[1] = &fixed;
          return compute(op, args);
        });
    // The rows' max, then their (Σ exp, picked logit) pairs: 3 numbers a row, not 2051.
    EXPECT_EQ(c.calls.size(), 2u) << kinds(c.calls);
    for (const RecordedCall& call : c.calls) {
      std::int64_t elements = 0;
      for (std::int64_t n : call.counts) elements += n;
      EXPECT_LE(elements, 4 * 2 * 512) << to_string(call);
    }
    EXPECT_EQ(to_string(c.placements), type == OpType::kSoftmaxCrossEntropy ? "R" : "S(1)");
  }
}

TEST(DTensorApi, DistributeFromOneDeviceAndRedistributeRules) {
  const DeviceMesh mesh = parse_mesh("2x2");
  const Tensor global = random_tensor(DType::kFloat32, {7, 5}, 5);
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    Tensor mine = comm.device() == 2 ? global.clone() : Tensor(DType::kFloat32, {7, 5});
    const DTensor t = distribute_tensor(comm, mine, mesh, parse_placements("S(0),S(1)"), 2);
    EXPECT_EQ(compare_exact(to_local(t), slice(global, shard_box(t.layout, comm.device()))),
              std::nullopt);
    const DTensor same = distribute_tensor(comm, global, mesh, parse_placements("R,S(0)"));
    EXPECT_EQ(compare_exact(full_tensor(same), global), std::nullopt);
    try {
      redistribute(t, parse_placements("P(sum),R"));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("target P(sum) on mesh dim 0 is Partial but the source"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(DTensorApi, TransformerFunctionsApplyTheirOperators) {
  // Heads split from a width-sharded [B, S, D], causal attention, heads merged back, a layer
  // norm; and a vocabulary-sharded embedding: each equal to the operator on whole tensors.
  const Tensor x = random_tensor(DType::kFloat64, {2, 8, 8}, 11);
  const Tensor w = random_tensor(DType::kFloat64, {8}, 12);
  const Tensor b = random_tensor(DType::kFloat64, {8}, 13);
  const Tensor table = random_tensor(DType::kFloat64, {10, 8}, 14);
  Tensor ids(DType::kInt64, {2, 8});
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data<std::int64_t>()[i] = (i * 7 + 3) % 10;
  auto whole = [](const Op& op, std::vector<const Tensor*> in) { return compute(op, in); };
  const Op heads{.type = OpType::kReshape, .shape = {2, 8, 2, 4}};
  const Op swap{.type = OpType::kTranspose, .dims = {0, 2, 1, 3}};
  const Tensor x4 = whole(heads, {&x});
  const Tensor xh = whole(swap, {&x4});
  const Tensor att = whole(Op{.type = OpType::kAttention, .causal = true}, {&xh, &xh, &xh});
  const Tensor back = whole(swap, {&att});
  const Tensor merged = whole(Op{.type = OpType::kReshape, .shape = {2, 8, 8}}, {&back});
  const Tensor want = whole(Op{.type = OpType::kLayerNorm, .eps = 1e-3}, {&merged, &w, &b});
  const Tensor looked_up = whole(Op{.type = OpType::kEmbedding}, {&ids, &table});
  launch({.devices = first_devices(4)}, [&](Communicator& comm) {
    const DeviceMesh mesh = parse_mesh("4");
    auto on = [&](const Tensor& t, const char* p) {
      return distribute_tensor(comm, t, mesh, parse_placements(p));
    };
    const DTensor dx = on(x, "S(2)"), dw = on(w, "R"), db = on(b, "R");
    const DTensor h = transpose(reshape(dx, {2, 8, 2, 4}), {0, 2, 1, 3});
    const DTensor a = attention(h, h, h, /*causal=*/true);
    const DTensor y = layer_norm(reshape(transpose(a, {0, 2, 1, 3}), {2, 8, 8}), dw, db, 1e-3);
    EXPECT_EQ(compare_close(full_tensor(y), want, 1e-12, 1e-12), std::nullopt);
    const DTensor e = embedding(on(ids, "R"), on(table, "S(0)"));
    EXPECT_EQ(to_string(e.layout.placements), "P(sum)");
    EXPECT_EQ(compare_close(full_tensor(e), looked_up, 1e-12, 1e-12), std::nullopt);
  });
}

TEST(DTensorApi, BadOperandsAreOneErrorNamingTheOperatorAndLayout) {
  const Tensor a = random_tensor(DType::kFloat32, {4, 4}, 1);
  launch({.devices = first_devices(4)}, [&](Communicator& comm) {
    const DTensor x = distribute_tensor(comm, a, parse_mesh("4"), parse_placements("S(0)"));
    const DTensor y = distribute_tensor(comm, a, parse_mesh("2x2"), parse_placements("R,S(1)"));
    try {
      add(x, y);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "add: operands are on different meshes (operand 0: mesh 4 placements S(0) shape "
                "4x4 float32; operand 1: mesh 2x2 placements R,S(1) shape 4x4 float32)");
    }
    try {
      from_local(comm, Tensor(DType::kFloat32, {3, 4}), parse_mesh("4"), parse_placements("S(0)"),
                 Shape{4, 4});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("from_local: device"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace meshflow
