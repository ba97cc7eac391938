#include "meshflow/mesh/layout.h"

#include <gtest/gtest.h>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

std::vector<std::int64_t> extents(std::int64_t size, std::int64_t parts) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < parts; ++i) out.push_back(chunk(size, parts, i).extent);
  return out;
}

TEST(ChunkRule, MatchesDTensor) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(extents(13, 4), (V{4, 4, 4, 1}));
  EXPECT_EQ(extents(9, 4), (V{3, 3, 3, 0}));
  EXPECT_EQ(extents(2, 4), (V{1, 1, 0, 0}));
  EXPECT_EQ(extents(5, 4), (V{2, 2, 1, 0}));
  EXPECT_EQ(extents(0, 4), (V{0, 0, 0, 0}));
  EXPECT_EQ(chunk(9, 4, 3).offset, 9);
  EXPECT_EQ(chunk(13, 4, 3).offset, 12);
}

TEST(ShardBox, UnevenLastDevicesMayBeEmpty) {
  Layout l = make_layout(make_mesh({4}), parse_placements("S(0)"), {2, 3});
  EXPECT_EQ(shard_box(l, 1), (Box{{1, 0}, {1, 3}}));
  EXPECT_EQ(shard_box(l, 3), (Box{{2, 0}, {0, 3}}));
}

TEST(ShardBox, NestedShardingAppliesOuterMeshDimFirst) {
  Layout l = make_layout(make_mesh({2, 2}), parse_placements("S(0),S(0)"), {5, 3});
  std::vector<std::int64_t> rows, offsets;
  for (DeviceId d = 0; d < 4; ++d) {
    rows.push_back(shard_box(l, d).extent[0]);
    offsets.push_back(shard_box(l, d).offset[0]);
  }
  EXPECT_EQ(rows, (std::vector<std::int64_t>{2, 1, 1, 1}));
  EXPECT_EQ(offsets, (std::vector<std::int64_t>{0, 2, 3, 4}));
}

TEST(ShardBox, TwoTensorDimsAndExplicitDevices) {
  Layout l = make_layout(parse_mesh("2x2@7,6,5,4"), parse_placements("S(1),S(0)"), {4, 6});
  EXPECT_EQ(shard_box(l, 6), (Box{{2, 0}, {2, 3}}));
  EXPECT_EQ(shard_box(l, 5), (Box{{0, 3}, {2, 3}}));
  EXPECT_THROW(shard_box(l, 0), Error);
}

TEST(Layout, ValidationNamesTheOffendingValue) {
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] {
              make_layout(make_mesh({2, 2}), parse_placements("S(0)"), {4});
            }).find("mesh 2x2 has 2 dims but placements \"S(0)\" give 1: give one placement per mesh dim"),
            std::string::npos);
  EXPECT_NE(msg([] {
              make_layout(make_mesh({2}), parse_placements("S(3)"), {4, 4});
            }).find("placement \"S(3)\" names tensor dim 3 but the tensor has 2 dims"),
            std::string::npos);
  EXPECT_NE(msg([] {
              make_layout(make_mesh({2}), parse_placements("S(-3)"), {4, 4});
            }).find("S(-3)"),
            std::string::npos);
  Layout l = make_layout(make_mesh({2}), parse_placements("S(-1)"), {4, 6});
  EXPECT_EQ(l.placements[0], Placement::shard(1));
  EXPECT_EQ(partial_dims(make_layout(make_mesh({2, 2}), parse_placements("R,P"), {4})),
            (std::vector<MeshDim>{1}));
}

}  // namespace
}  // namespace meshflow
