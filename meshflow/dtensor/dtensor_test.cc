// The DTensor API on the threads backend: every operator, forward and backward, on random
// layouts (uneven and empty shards, Partial operands with random terms) of meshes (4) and (2,2),
// against the single-device result; the partial-propagation rules with their communication
// counted by the recording Communicator; and the user-facing errors.
#include "meshflow/dtensor/dtensor.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "meshflow/comm/launch.h"
#include "meshflow/comm/recording.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/ops/gradient.h"

namespace meshflow {
namespace {

// Every device's shard of a layout, with random values: replicas hold the same bytes and each
// Partial term is random, so the global value is what assemble() reduces them to.
std::vector<Tensor> random_shards(const Layout& layout, std::uint64_t seed,
                                  const std::function<void(Tensor&)>& transform = nullptr) {
  std::vector<Tensor> shards;
  for (std::size_t i = 0; i < layout.mesh.devices.size(); ++i) {
    const DeviceId d = layout.mesh.devices[i];
    const std::vector<std::int64_t> coords = coordinates(layout.mesh, d);
    std::uint64_t s = seed * 1000003;
    for (std::size_t m = 0; m < coords.size(); ++m)
      s = s * 31 + (layout.placements[m].is_replicate() ? 0 : static_cast<std::uint64_t>(coords[m]) + 1);
    Tensor t = random_tensor(layout.dtype, local_shape(layout, d), s);
    if (transform) transform(t);
    shards.push_back(std::move(t));
  }
  return shards;
}

// Single-device gradient program run (the reference).
std::vector<std::optional<Tensor>> reference_backward(const Op& op, const std::vector<const Tensor*>& in,
                                                      const Tensor& out, const Tensor& g) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : in) specs.push_back(spec_of(*t));
  const GradProgram p = gradient_program(op, specs);
  std::vector<Tensor> steps;
  auto value = [&](const GradRef& r) -> const Tensor& {
    switch (r.kind) {
      case GradRef::Kind::kInput: return *in[static_cast<std::size_t>(r.index)];
      case GradRef::Kind::kOutput: return out;
      case GradRef::Kind::kGrad: return g;
      case GradRef::Kind::kStep: break;
    }
    return steps[static_cast<std::size_t>(r.index)];
  };
  for (const GradStep& s : p.steps) {
    std::vector<const Tensor*> args;
    for (const GradRef& r : s.args) args.push_back(&value(r));
    steps.push_back(compute(s.op, args));
  }
  std::vector<std::optional<Tensor>> grads;
  for (const auto& r : p.input_grads) grads.push_back(r ? std::optional<Tensor>(value(*r).clone()) : std::nullopt);
  return grads;
}

struct Operand {
  Shape shape;
  DType dtype = DType::kFloat64;
  bool partial_ok = true;  // may be drawn Partial
  std::function<void(Tensor&)> transform = nullptr;  // applied to every shard (denominators)
};

std::vector<Placement> random_placements(std::mt19937& rng, const DeviceMesh& mesh,
                                         const Operand& o) {
  std::vector<Placement> choices{Placement::replicate()};
  for (std::size_t d = 0; d < o.shape.size(); ++d) choices.push_back(Placement::shard(static_cast<int>(d)));
  if (o.partial_ok && is_floating(o.dtype)) {
    choices.push_back(Placement::partial(ReduceOp::kSum));
    choices.push_back(Placement::partial(ReduceOp::kAvg));
  }
  std::vector<Placement> p;
  for (int m = 0; m < ndim(mesh); ++m) p.push_back(choices[rng() % choices.size()]);
  return p;
}

// Runs op forward and backward on random layouts of `mesh`, `trials` times, against the
// single-device result.
void check_operator(const Op& op, const std::vector<Operand>& operands, std::uint64_t seed,
                    int trials = 4) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (std::string_view mesh_text : {"4", "2x2"}) {
    const DeviceMesh mesh = parse_mesh(mesh_text);
    for (int trial = 0; trial < trials; ++trial) {
      std::vector<Layout> layouts;
      std::vector<std::vector<Tensor>> shards;
      std::vector<Tensor> globals;
      for (std::size_t i = 0; i < operands.size(); ++i) {
        const Operand& o = operands[i];
        layouts.push_back(make_layout(mesh, random_placements(rng, mesh, o), o.shape, o.dtype));
        shards.push_back(random_shards(layouts.back(), seed + 17 * i + 101 * trial, o.transform));
        globals.push_back(assemble(layouts.back(), shards.back()));
      }
      std::vector<const Tensor*> gp;
      for (const Tensor& g : globals) gp.push_back(&g);
      const Tensor want = compute(op, gp);
      const bool differentiable = is_floating(want.dtype());
      // The incoming gradient: random, in a random (non-Partial) layout of the result.
      const Operand gop{want.shape(), want.dtype(), false};
      const Layout g_layout = make_layout(mesh, random_placements(rng, mesh, gop), want.shape(), want.dtype());
      const std::vector<Tensor> g_shards = random_shards(g_layout, seed + 7 + trial);
      const Tensor g_global = assemble(g_layout, g_shards);
      std::vector<std::optional<Tensor>> want_grads;
      if (differentiable) want_grads = reference_backward(op, gp, want, g_global);
      std::string context = fmt::format("{} on mesh {} with", to_string(op), mesh_text);
      for (const Layout& l : layouts) context += " [" + to_string(l.placements) + " " + to_string(l.shape) + "]";
      const double tol = want.dtype() == DType::kFloat32 ? 1e-4 : 1e-9;
      launch({.devices = mesh.devices}, [&](Communicator& comm) {
        const auto index = static_cast<std::size_t>(*find_device(mesh, comm.device()));
        std::vector<DTensor> in;
        std::vector<const DTensor*> ptrs;
        for (std::size_t i = 0; i < operands.size(); ++i)
          in.push_back(from_local(comm, shards[i][index].clone(), mesh, layouts[i].placements, layouts[i].shape));
        for (const DTensor& t : in) ptrs.push_back(&t);
        const DTensor y = apply_op(op, ptrs);
        const Tensor got = full_tensor(y);
        EXPECT_EQ(compare_close(got, want, tol, tol), std::nullopt)
            << context << " -> " << to_string(y.layout.placements);
        if (!differentiable) return;
        const DTensor g = from_local(comm, g_shards[index].clone(), mesh, g_layout.placements, g_layout.shape);
        const auto grads = backward(op, ptrs, y, g);
        for (std::size_t i = 0; i < grads.size(); ++i) {
          ASSERT_EQ(grads[i].has_value(), want_grads[i].has_value());
          if (!grads[i]) continue;
          EXPECT_EQ(compare_close(full_tensor(*grads[i]), *want_grads[i], tol, tol), std::nullopt)
              << context << " gradient of operand " << i << " (incoming gradient "
              << to_string(g_layout.placements) << ")";
        }
      });
    }
  }
}

void positive(Tensor& t) {
  for (double& x : t.data<double>()) x = 1 + x * x;
}

TEST(DTensorOperators, MatchTheSingleDeviceResultForwardAndBackward) {
  check_operator({.type = OpType::kMatmul}, {{{5, 3}}, {{3, 6}}}, 1);
  check_operator({.type = OpType::kMatmul}, {{{2, 5, 3}}, {{3, 6}}}, 2);
  check_operator({.type = OpType::kLinear}, {{{5, 3}}, {{3, 6}}, {{6}}}, 3);
  check_operator({.type = OpType::kLinear}, {{{5, 3}}, {{3, 6}}}, 4);
  for (OpType t : {OpType::kAdd, OpType::kSub, OpType::kMul}) {
    check_operator({.type = t}, {{{5, 6}}, {{5, 6}}}, 10 + static_cast<int>(t));
    check_operator({.type = t}, {{{5, 6}}, {{6}}}, 20 + static_cast<int>(t));
    check_operator({.type = t}, {{{5, 1}}, {{1, 6}}}, 30 + static_cast<int>(t));
  }
  check_operator({.type = OpType::kDiv}, {{{5, 6}}, {{6}, DType::kFloat64, true, positive}}, 40);
  check_operator({.type = OpType::kDiv}, {{{5, 6}}, {{5, 6}, DType::kFloat64, true, positive}}, 41);
  for (OpType t : {OpType::kNeg, OpType::kRelu, OpType::kGelu, OpType::kTanh, OpType::kSigmoid,
                   OpType::kExp})
    check_operator({.type = t}, {{{5, 6}}}, 50 + static_cast<int>(t));
  for (std::vector<int> dims : std::vector<std::vector<int>>{{0}, {1}, {0, 1}}) {
    check_operator({.type = OpType::kSum, .dims = dims}, {{{5, 6}}}, 60);
    check_operator({.type = OpType::kMean, .dims = dims}, {{{5, 6}}}, 61);
  }
  check_operator({.type = OpType::kSoftmax}, {{{5, 6}}}, 70);
  check_operator({.type = OpType::kSoftmax, .dim = 0}, {{{5, 6}}}, 71);
  auto labels = [](Tensor& t) {
    for (std::int64_t& x : t.data<std::int64_t>()) x = ((x % 6) + 6) % 6;
  };
  check_operator({.type = OpType::kSoftmaxCrossEntropy},
                 {{{5, 6}}, {{5}, DType::kInt64, false, labels}}, 72);
  check_operator({.type = OpType::kMse}, {{{5, 6}}, {{5, 6}}}, 73);
}

TEST(DTensorOperators, Float32AndIntegerOperandsToo) {
  check_operator({.type = OpType::kMatmul}, {{{5, 3}, DType::kFloat32}, {{3, 6}, DType::kFloat32}}, 80, 2);
  check_operator({.type = OpType::kGelu}, {{{5, 6}, DType::kFloat32}}, 81, 2);
  check_operator({.type = OpType::kAdd}, {{{5, 6}, DType::kInt64}, {{6}, DType::kInt64}}, 82, 2);
  check_operator({.type = OpType::kSum, .dims = {0}}, {{{5, 6}, DType::kInt32}}, 83, 2);
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
  for (std::size_t i = 0; i < layouts.size(); ++i) globals.push_back(global_of(layouts[i], 300 + i, shards));
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
      in.push_back(from_local(recording, shards[i][index].clone(), mesh, layouts[i].placements, layouts[i].shape));
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
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape), DType::kFloat64);
}

Counted counted_op(OpType type, const std::vector<Layout>& layouts) {
  const Op op{.type = type};
  return run_counted(
      layouts, [&](const std::vector<const DTensor*>& in) { return apply_op(op, in); },
      [&](const std::vector<const Tensor*>& in) { return compute(op, in); });
}

std::string kinds(const CallLog& log) {
  std::string s;
  for (const RecordedCall& c : log) s += (s.empty() ? "" : " ") + c.collective;
  return s.empty() ? "none" : s;
}

TEST(DTensorPartial, LinearOperatorsKeepPartialWithoutCommunication) {
  const Layout p = L("4", "P(sum)", {8, 6}), r = L("4", "R", {8, 6}), avg = L("4", "P(avg)", {8, 6});
  struct Row {
    OpType op;
    std::vector<Layout> in;
    std::string placements;
  };
  const std::vector<Row> rows = {
      {OpType::kAdd, {p, p}, "P(sum)"},      {OpType::kAdd, {p, r}, "P(sum)"},
      {OpType::kAdd, {avg, r}, "P(avg)"},    {OpType::kSub, {r, p}, "P(sum)"},
      {OpType::kMul, {p, r}, "P(sum)"},      {OpType::kMul, {r, p}, "P(sum)"},
      {OpType::kMul, {avg, r}, "P(avg)"},    {OpType::kDiv, {p, r}, "P(sum)"},
      {OpType::kNeg, {p}, "P(sum)"},         {OpType::kNeg, {avg}, "P(avg)"},
      {OpType::kMatmul, {p, L("4", "R", {6, 5})}, "P(sum)"},
  };
  for (const Row& row : rows) {
    std::vector<Layout> in = row.in;
    if (row.op == OpType::kDiv) in[1] = r;  // denominators stay away from 0 below
    const Counted c = row.op == OpType::kDiv
                          ? run_counted(
                                in,
                                [](const std::vector<const DTensor*>& x) { return div(*x[0], *x[1]); },
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
  for (const auto& [type, in] : std::vector<std::pair<OpType, Layout>>{{OpType::kRelu, p}, {OpType::kExp, avg}}) {
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
  const Layout x = L("4", "R", {64, 32}), w1 = L("4", "S(1)", {32, 128}), w2 = L("4", "S(0)", {128, 32});
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

TEST(DTensorApi, DistributeFromOneDeviceAndRedistributeRules) {
  const DeviceMesh mesh = parse_mesh("2x2");
  const Tensor global = random_tensor(DType::kFloat32, {7, 5}, 5);
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    Tensor mine = comm.device() == 2 ? global.clone() : Tensor(DType::kFloat32, {7, 5});
    const DTensor t = distribute_tensor(comm, mine, mesh, parse_placements("S(0),S(1)"), 2);
    EXPECT_EQ(compare_exact(to_local(t), slice(global, shard_box(t.layout, comm.device()))), std::nullopt);
    const DTensor same = distribute_tensor(comm, global, mesh, parse_placements("R,S(0)"));
    EXPECT_EQ(compare_exact(full_tensor(same), global), std::nullopt);
    try {
      redistribute(t, parse_placements("P(sum),R"));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("target P(sum) on mesh dim 0 is Partial but the source"), std::string::npos)
          << e.what();
    }
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
      from_local(comm, Tensor(DType::kFloat32, {3, 4}), parse_mesh("4"), parse_placements("S(0)"), Shape{4, 4});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("from_local: device"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace meshflow
