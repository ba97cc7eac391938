#include "tests/dtensor_check.h"

#include <gtest/gtest.h>

#include <random>

#include "meshflow/comm/launch.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/dtensor/dtensor.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/ops/gradient.h"

namespace meshflow::testing {

std::vector<Tensor> random_shards(const Layout& layout, std::uint64_t seed,
                                  const std::function<void(Tensor&)>& transform) {
  std::vector<Tensor> shards;
  for (std::size_t i = 0; i < layout.mesh.devices.size(); ++i) {
    const DeviceId d = layout.mesh.devices[i];
    const std::vector<std::int64_t> coords = coordinates(layout.mesh, d);
    std::uint64_t s = seed * 1000003;
    for (std::size_t m = 0; m < coords.size(); ++m)
      s = s * 31 +
          (layout.placements[m].is_replicate() ? 0 : static_cast<std::uint64_t>(coords[m]) + 1);
    Tensor t = random_tensor(layout.dtype, local_shape(layout, d), s);
    if (transform) transform(t);
    shards.push_back(std::move(t));
  }
  return shards;
}

namespace {

std::vector<Placement> random_placements(std::mt19937& rng, const DeviceMesh& mesh,
                                         const Operand& o) {
  std::vector<Placement> choices{Placement::replicate()};
  for (std::size_t d = 0; d < o.shape.size(); ++d)
    choices.push_back(Placement::shard(static_cast<int>(d)));
  if (o.partial_ok && is_floating(o.dtype)) {
    choices.push_back(Placement::partial(ReduceOp::kSum));
    choices.push_back(Placement::partial(ReduceOp::kAvg));
  }
  std::vector<Placement> p;
  for (int m = 0; m < ndim(mesh); ++m) p.push_back(choices[rng() % choices.size()]);
  return p;
}

}  // namespace

void check_operator(Backend backend, const Op& op, const std::vector<Operand>& operands,
                    std::uint64_t seed, int trials) {
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
      const Layout g_layout =
          make_layout(mesh, random_placements(rng, mesh, gop), want.shape(), want.dtype());
      const std::vector<Tensor> g_shards = random_shards(g_layout, seed + 7 + trial);
      const Tensor g_global = assemble(g_layout, g_shards);
      std::vector<std::optional<Tensor>> want_grads;
      if (differentiable) want_grads = compute_backward(op, gp, want, g_global);
      std::string context = fmt::format("{} on mesh {} with", to_string(op), mesh_text);
      for (const Layout& l : layouts)
        context += " [" + to_string(l.placements) + " " + to_string(l.shape) + "]";
      const double tol = want.dtype() == DType::kFloat32 ? 1e-4 : 1e-9;
      launch(backend == Backend::kMpi ? LaunchOptions{.backend = Backend::kMpi}
                                      : LaunchOptions{.devices = mesh.devices},
             [&](Communicator& comm) {
               const auto index = static_cast<std::size_t>(*find_device(mesh, comm.device()));
               std::vector<DTensor> in;
               std::vector<const DTensor*> ptrs;
               for (std::size_t i = 0; i < operands.size(); ++i)
                 in.push_back(from_local(comm, shards[i][index].clone(), mesh,
                                         layouts[i].placements, layouts[i].shape));
               for (const DTensor& t : in) ptrs.push_back(&t);
               const DTensor y = apply_op(op, ptrs);
               const Tensor got = full_tensor(y);
               EXPECT_EQ(compare_close(got, want, tol, tol), std::nullopt)
                   << context << " -> " << to_string(y.layout.placements);
               if (!differentiable) return;
               const DTensor g = from_local(comm, g_shards[index].clone(), mesh,
                                            g_layout.placements, g_layout.shape);
               const auto grads = backward(op, ptrs, y, g);
               for (std::size_t i = 0; i < grads.size(); ++i) {
                 ASSERT_EQ(grads[i].has_value(), want_grads[i].has_value());
                 if (!grads[i]) continue;
                 EXPECT_EQ(compare_close(full_tensor(*grads[i]), *want_grads[i], tol, tol),
                           std::nullopt)
                     << context << " gradient of operand " << i << " (incoming gradient "
                     << to_string(g_layout.placements) << ")";
               }
             });
    }
  }
}

namespace {
void positive(Tensor& t) {
  for (double& x : t.data<double>()) x = 1 + x * x;
}

}  // namespace

void check_every_operator(Backend backend, int trials) {
  check_operator(backend, {.type = OpType::kMatmul}, {{{5, 3}}, {{3, 6}}}, 1, trials);
  check_operator(backend, {.type = OpType::kMatmul}, {{{2, 5, 3}}, {{3, 6}}}, 2, trials);
  check_operator(backend, {.type = OpType::kLinear}, {{{5, 3}}, {{3, 6}}, {{6}}}, 3, trials);
  check_operator(backend, {.type = OpType::kLinear}, {{{5, 3}}, {{3, 6}}}, 4, trials);
  for (OpType t : {OpType::kAdd, OpType::kSub, OpType::kMul}) {
    check_operator(backend, {.type = t}, {{{5, 6}}, {{5, 6}}}, 10 + static_cast<int>(t), trials);
    check_operator(backend, {.type = t}, {{{5, 6}}, {{6}}}, 20 + static_cast<int>(t), trials);
    check_operator(backend, {.type = t}, {{{5, 1}}, {{1, 6}}}, 30 + static_cast<int>(t), trials);
  }
  check_operator(backend, {.type = OpType::kDiv},
                 {{{5, 6}}, {{6}, DType::kFloat64, true, positive}}, 40, trials);
  check_operator(backend, {.type = OpType::kDiv},
                 {{{5, 6}}, {{5, 6}, DType::kFloat64, true, positive}}, 41, trials);
  for (OpType t :
       {OpType::kNeg, OpType::kRelu, OpType::kGelu, OpType::kTanh, OpType::kSigmoid, OpType::kExp})
    check_operator(backend, {.type = t}, {{{5, 6}}}, 50 + static_cast<int>(t), trials);
  for (std::vector<int> dims : std::vector<std::vector<int>>{{0}, {1}, {0, 1}}) {
    check_operator(backend, {.type = OpType::kSum, .dims = dims}, {{{5, 6}}}, 60, trials);
    check_operator(backend, {.type = OpType::kMean, .dims = dims}, {{{5, 6}}}, 61, trials);
  }
  check_operator(backend, {.type = OpType::kSoftmax}, {{{5, 6}}}, 70, trials);
  check_operator(backend, {.type = OpType::kSoftmax, .dim = 0}, {{{5, 6}}}, 71, trials);
  auto labels = [](Tensor& t) {
    for (std::int64_t& x : t.data<std::int64_t>()) x = ((x % 6) + 6) % 6;
  };
  check_operator(backend, {.type = OpType::kSoftmaxCrossEntropy},
                 {{{5, 6}}, {{5}, DType::kInt64, false, labels}}, 72, trials);
  check_operator(backend, {.type = OpType::kMse}, {{{5, 6}}, {{5, 6}}}, 73, trials);
  // views: splits and merges of (possibly unevenly) sharded dims, size-1 dims, a -1, and
  // transposes of sharded tensors
  check_operator(backend, {.type = OpType::kReshape, .shape = {2, 3, 5}}, {{{6, 5}}}, 74, trials);
  check_operator(backend, {.type = OpType::kReshape, .shape = {-1}}, {{{6, 5}}}, 75, trials);
  check_operator(backend, {.type = OpType::kReshape, .shape = {16, 6}}, {{{12, 8}}}, 76, trials);
  check_operator(backend, {.type = OpType::kReshape, .shape = {5, 1, 2, 4}}, {{{5, 8, 1}}}, 77,
                 trials);
  check_operator(backend, {.type = OpType::kTranspose, .dims = {1, 0}}, {{{5, 6}}}, 78, trials);
  check_operator(backend, {.type = OpType::kTranspose, .dims = {2, 0, 1}}, {{{3, 5, 4}}}, 79,
                 trials);
  check_operator(backend, {.type = OpType::kLayerNorm}, {{{5, 6}}, {{6}}, {{6}}}, 85, trials);
  check_operator(backend, {.type = OpType::kLayerNorm}, {{{2, 3, 4}}, {{4}}, {{4}}}, 86, trials);
  auto vocab7 = [](Tensor& t) {
    for (std::int64_t& x : t.data<std::int64_t>()) x = ((x % 7) + 7) % 7;
  };
  check_operator(backend, {.type = OpType::kEmbedding},
                 {{{5}, DType::kInt64, false, vocab7}, {{7, 6}}}, 87, trials);
  check_operator(backend, {.type = OpType::kEmbedding},
                 {{{2, 3}, DType::kInt64, false, vocab7}, {{7, 4}}}, 88, trials);
  for (bool causal : {false, true}) {
    check_operator(backend, {.type = OpType::kAttention, .causal = causal},
                   {{{2, 6, 3}}, {{2, 6, 3}}, {{2, 6, 4}}}, 89, trials);
  }
  check_operator(backend, {.type = OpType::kAttention}, {{{5, 3}}, {{7, 3}}, {{7, 2}}}, 90, trials);
  // float32 and integer operands, fewer draws
  const int few = (trials + 1) / 2;
  check_operator(backend, {.type = OpType::kMatmul},
                 {{{5, 3}, DType::kFloat32}, {{3, 6}, DType::kFloat32}}, 80, few);
  check_operator(backend, {.type = OpType::kGelu}, {{{5, 6}, DType::kFloat32}}, 81, few);
  check_operator(backend, {.type = OpType::kAdd}, {{{5, 6}, DType::kInt64}, {{6}, DType::kInt64}},
                 82, few);
  check_operator(backend, {.type = OpType::kSum, .dims = {0}}, {{{5, 6}, DType::kInt32}}, 83, few);
}

}  // namespace meshflow::testing
