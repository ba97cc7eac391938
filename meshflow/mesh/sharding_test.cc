#include "meshflow/mesh/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharded_folder.h"

namespace meshflow {
namespace {

// Draws a random mesh (1-3 dims of size 1-4, shuffled device ids), a shape (0-3 dims, extents
// 0-9) and Shard/Replicate placements.
Layout random_layout(std::mt19937& rng, DType dtype) {
  Shape mesh_shape(1 + rng() % 3);
  for (auto& e : mesh_shape) e = 1 + rng() % 4;
  std::vector<DeviceId> ids(numel(mesh_shape));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<DeviceId>(i * 3 + 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  Shape shape(rng() % 4);
  for (auto& e : shape) e = rng() % 10;
  std::vector<Placement> ps;
  for (std::size_t m = 0; m < mesh_shape.size(); ++m) {
    if (!shape.empty() && rng() % 3 != 0) {
      ps.push_back(Placement::shard(static_cast<int>(rng() % shape.size())));
    } else {
      ps.push_back(Placement::replicate());
    }
  }
  return make_layout(make_mesh(mesh_shape, ids), ps, shape, dtype);
}

TEST(Sharding, ShardThenAssembleIsIdentityAndCoverageMatchesReplication) {
  const unsigned seed = 20261121;
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64};
  for (int trial = 0; trial < 500; ++trial) {
    Layout layout = random_layout(rng, dtypes[trial % 4]);
    SCOPED_TRACE(fmt::format("seed {} trial {}: {}", seed, trial, to_string(layout)));
    Tensor global = random_tensor(layout.dtype, layout.shape, trial);
    std::vector<Tensor> shards = shard_tensor(global, layout);
    EXPECT_EQ(compare_exact(assemble(layout, shards), global), std::nullopt);

    std::int64_t replicas = 1;
    for (std::size_t m = 0; m < layout.placements.size(); ++m) {
      if (layout.placements[m].is_replicate()) replicas *= layout.mesh.shape[m];
    }
    std::vector<std::int64_t> held(numel(layout.shape), 0);
    const auto strides = row_major_strides(layout.shape);
    for (DeviceId d : layout.mesh.devices) {
      Box box = shard_box(layout, d);
      for (std::int64_t n = 0; n < numel(box); ++n) {
        std::int64_t rem = n, flat = 0;
        for (std::size_t k = box.extent.size(); k-- > 0;) {
          flat += (box.offset[k] + rem % box.extent[k]) * strides[k];
          rem /= box.extent[k];
        }
        ++held[flat];
      }
    }
    for (std::int64_t count : held) ASSERT_EQ(count, replicas);
  }
}

// Four random terms on a 2x2 mesh, reduced under several Partial op combinations.
TEST(Assemble, ReducesPartialSumAvgMaxAndMixed) {
  DeviceMesh mesh = make_mesh({2, 2});
  Tensor a = random_tensor(DType::kFloat64, {3, 4}, 1);
  Tensor b = random_tensor(DType::kFloat64, {3, 4}, 2);
  Tensor c = random_tensor(DType::kFloat64, {3, 4}, 3);
  Tensor d = random_tensor(DType::kFloat64, {3, 4}, 4);
  auto terms = [&] {
    std::vector<Tensor> v;
    for (Tensor* t : {&a, &b, &c, &d}) v.push_back(t->clone());
    return v;
  };
  auto expect = [&](const char* placements, auto combine) {
    Tensor want(DType::kFloat64, {3, 4});
    for (std::size_t i = 0; i < 12; ++i) {
      want.data<double>()[i] = combine(a.data<double>()[i], b.data<double>()[i],
                                       c.data<double>()[i], d.data<double>()[i]);
    }
    Tensor got =
        assemble(make_layout(mesh, parse_placements(placements), {3, 4}, DType::kFloat64), terms());
    EXPECT_EQ(compare_close(got, want, 1e-12, 1e-12), std::nullopt) << placements;
  };
  expect("P,P", [](double w, double x, double y, double z) { return w + x + y + z; });
  expect("P(avg),P(sum)",
         [](double w, double x, double y, double z) { return (w + x + y + z) / 2; });
  expect("P(max),P(max)", [](double w, double x, double y, double z) {
    return std::max({w, x, y, z});
  });
  expect("P(sum),P(max)",
         [](double w, double x, double y, double z) { return std::max(w, x) + std::max(y, z); });
}

TEST(Assemble, DisagreeingReplicasAreNamed) {
  Layout l = make_layout(make_mesh({2, 2}), parse_placements("S(0),R"), {4, 2}, DType::kInt32);
  Tensor g = random_tensor(DType::kInt32, {4, 2}, 9);
  std::vector<Tensor> shards = shard_tensor(g, l);
  shards[3].data<std::int32_t>()[1] += 1;
  try {
    assemble(l, shards);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("devices 2 (rank2) and 3 (rank3)"), std::string::npos)
        << e.what();
  }
  Layout partial = make_layout(make_mesh({2}), parse_placements("P"), {4, 2}, DType::kInt32);
  EXPECT_THROW(shard_tensor(g, partial), Error);
}

TEST(ShardedFolder, RoundTripsAndRejectsMismatchedShards) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "meshflow_sharded_folder_test";
  fs::remove_all(dir);
  Layout l = make_layout(parse_mesh("2x2@3,1,2,0"), parse_placements("S(1),S(0)"), {5, 7});
  Tensor g = random_tensor(DType::kFloat32, {5, 7}, 3);
  write_sharded(dir, l, shard_tensor(g, l));
  ShardedTensor st = read_sharded(dir);
  EXPECT_EQ(st.layout, l);
  EXPECT_EQ(compare_exact(assemble(st.layout, st.shards), g), std::nullopt);
  // Replacing an existing folder works; a wrong shard on disk is named.
  write_sharded(dir, l, shard_tensor(g, l));
  write_npy(dir / "rank2.npy", Tensor(DType::kFloat32, {1, 1}));
  try {
    read_sharded(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank2.npy"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshflow
