// The global view on the threads backend, against independent references: distribute against
// slicing the global tensor, full_tensor against the checked assemble, operators against the
// single-device kernel. Small tensors run on the calling thread and large ones on the device
// threads (global_view.h); both sizes are checked, and operators are called often enough that
// both ways run.
#include "meshflow/dtensor/global_view.h"

#include <gtest/gtest.h>

#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {
namespace {

const Shape kSmall{7, 5};
const Shape kLarge{1037, 515};  // ~2 MiB of float32: handed to the device threads

std::vector<std::vector<Placement>> layouts_2x2() {
  const Placement r = Placement::replicate();
  return {{Placement::shard(0), Placement::shard(1)},
          {r, Placement::shard(0)},
          {Placement::shard(1), r},
          {r, r}};
}

TEST(GlobalView, DistributeSlicesAndFullTensorGivesTheArrayBack) {
  Session session(Backend::kThreads);
  const DeviceMesh mesh = make_mesh({2, 2});
  for (const Shape& shape : {kSmall, kLarge}) {
    const Tensor global = random_tensor(DType::kFloat32, shape, 11);
    for (const auto& placements : layouts_2x2()) {
      const GlobalTensor g = distribute(session, view(global), mesh, placements);
      ASSERT_EQ(g.shards.size(), 4u);
      for (const auto& [d, shard] : g.shards) {
        const auto diff = compare_exact(shard, slice(global, shard_box(g.layout, d)));
        EXPECT_FALSE(diff) << to_string(g.layout) << " device " << d << ": " << *diff;
      }
      const auto diff = compare_exact(full_tensor(session, g), global);
      EXPECT_FALSE(diff) << to_string(g.layout) << ": " << *diff;
    }
  }
}

// Partial terms are reduced where their box is one contiguous run of the result (P(sum),S(0))
// and through a temporary where it is not (S(1),P(sum)).
TEST(GlobalView, FullTensorReducesPartialTermsAsAssembleDoes) {
  Session session(Backend::kThreads);
  const DeviceMesh mesh = make_mesh({2, 2});
  const Placement sum = Placement::partial(ReduceOp::kSum);
  for (const Shape& shape : {kSmall, kLarge}) {
    for (const auto& placements : std::vector<std::vector<Placement>>{
             {sum, Placement::shard(0)}, {Placement::shard(1), sum}, {sum, sum}}) {
      GlobalTensor g{make_layout(mesh, placements, shape, DType::kFloat64), {}};
      std::vector<Tensor> shards;
      for (DeviceId d : mesh.devices) {
        shards.push_back(random_tensor(DType::kFloat64, local_shape(g.layout, d), 20 + d));
        g.shards.emplace(d, shards.back().clone());
      }
      const auto diff = compare_exact(full_tensor(session, g), assemble(g.layout, shards));
      EXPECT_FALSE(diff) << to_string(g.layout) << ": " << *diff;
    }
  }
}

TEST(GlobalView, OperatorsMatchTheSingleDeviceKernelOnEitherThread) {
  Session session(Backend::kThreads);
  const DeviceMesh mesh = make_mesh({4});
  for (const Shape& shape : {kSmall, kLarge}) {
    const Tensor a = random_tensor(DType::kFloat32, shape, 31);
    const Tensor b = random_tensor(DType::kFloat32, shape, 32);
    const Tensor w = random_tensor(DType::kFloat32, {shape[1], 9}, 33);
    const GlobalTensor ga = distribute(session, view(a), mesh, {Placement::shard(0)});
    const GlobalTensor gb = distribute(session, view(b), mesh, {Placement::shard(0)});
    const GlobalTensor gw = distribute(session, view(w), mesh, {Placement::replicate()});
    // Moves data: b is read column-sharded, so it is redistributed first.
    const GlobalTensor gc = distribute(session, view(b), mesh, {Placement::shard(1)});
    const Op add{.type = OpType::kAdd}, mm{.type = OpType::kMatmul};
    const Tensor sum = compute(add, {&a, &b});
    const Tensor product = compute(mm, {&a, &w});
    for (int call = 0; call < 40; ++call) {  // more than one exploration period
      auto diff = compare_exact(full_tensor(session, apply_op(session, add, {&ga, &gb})), sum);
      ASSERT_FALSE(diff) << "add, call " << call << ": " << *diff;
      diff = compare_close(full_tensor(session, apply_op(session, mm, {&ga, &gw})), product, 1e-5,
                           1e-5);
      ASSERT_FALSE(diff) << "matmul, call " << call << ": " << *diff;
    }
    const auto diff = compare_exact(full_tensor(session, apply_op(session, add, {&ga, &gc})), sum);
    EXPECT_FALSE(diff) << "add after moving b: " << *diff;
  }
}

}  // namespace
}  // namespace meshflow
