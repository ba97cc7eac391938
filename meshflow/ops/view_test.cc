// Views: reshape's dim groups, the kernels against index arithmetic written here, the shard
// mapping rule on hand-worked layouts, and the errors a user can cause.
#include "meshflow/ops/view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/kernels/parallel.h"
#include "tests/error_of.h"

namespace meshflow {
namespace {

std::string groups_text(const Shape& from, const Shape& to) {
  std::string s;
  for (const DimGroup& g : reshape_groups(from, to))
    s += fmt::format("{}[{},{})->[{},{})", s.empty() ? "" : " ", g.in_begin, g.in_end, g.out_begin,
                     g.out_end);
  return s;
}

TEST(ReshapeGroups, ShortestRunsOfDimsWithEqualProducts) {
  EXPECT_EQ(groups_text({4, 6, 16}, {4, 6, 4, 4}), "[0,1)->[0,1) [1,2)->[1,2) [2,3)->[2,4)");
  EXPECT_EQ(groups_text({12, 8}, {16, 6}), "[0,2)->[0,2)");
  EXPECT_EQ(groups_text({2, 3, 4}, {6, 4}), "[0,2)->[0,1) [2,3)->[1,2)");
  EXPECT_EQ(groups_text({1, 12}, {12}), "[0,1)->[0,0) [1,2)->[0,1)");
  EXPECT_EQ(groups_text({24}, {3, 1, 8}), "[0,1)->[0,3)");
  EXPECT_EQ(groups_text({3, 8}, {3, 1, 8}), "[0,1)->[0,1) [1,1)->[1,2) [1,2)->[2,3)");
  EXPECT_EQ(groups_text({1}, {1, 1}), "[0,1)->[0,1) [1,1)->[1,2)");
  EXPECT_EQ(groups_text({}, {1}), "[0,0)->[0,1)");
  EXPECT_EQ(groups_text({0, 3}, {3, 0}), "[0,2)->[0,2)");
}

TEST(ViewKernels, TransposeMatchesIndexArithmeticForEveryDtype) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kInt32, DType::kInt64}) {
    const Tensor x = random_tensor(dtype, {3, 5, 4}, 7);
    const Tensor y = compute({.type = OpType::kTranspose, .dims = {2, 0, -2}}, {&x});
    ASSERT_EQ(y.shape(), (Shape{4, 3, 5}));
    const std::size_t es = size_of(dtype);
    for (std::int64_t a = 0; a < 4; ++a)
      for (std::int64_t b = 0; b < 3; ++b)
        for (std::int64_t c = 0; c < 5; ++c) {
          const std::byte* want = x.bytes() + ((b * 5 + c) * 4 + a) * static_cast<std::int64_t>(es);
          const std::byte* got = y.bytes() + ((a * 3 + b) * 5 + c) * static_cast<std::int64_t>(es);
          ASSERT_EQ(std::memcmp(want, got, es), 0) << to_string(dtype) << " at " << a << b << c;
        }
  }
  const Tensor m = random_tensor(DType::kFloat32, {2, 3}, 8);
  const Tensor t = compute({.type = OpType::kTranspose}, {&m});  // no dims: reversed
  ASSERT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.data<float>()[1], m.data<float>()[3]);  // t[0][1] = m[1][0]
}

// Every permutation of a rank-4 operand whose runs are short, long (37 floats: two 64-byte moves
// and a tail) or strided, alone and on a team of 3 (whose parts start in the middle of a run),
// against index arithmetic.
TEST(ViewKernels, EveryPermutationOfRankFourMatchesIndexArithmetic) {
  const Shape shape{3, 5, 2, 37};
  const Tensor x = random_tensor(DType::kFloat32, shape, 11);
  std::vector<int> perm = {0, 1, 2, 3};
  ThreadTeam team(3);
  do {
    Shape out;
    for (int p : perm) out.push_back(shape[static_cast<std::size_t>(p)]);
    for (bool on_team : {false, true}) {
      Tensor y;
      {
        const UseTeam use(on_team ? &team : nullptr);
        y = compute({.type = OpType::kTranspose, .dims = perm}, {&x});
      }
      ASSERT_EQ(y.shape(), out);
      std::vector<std::int64_t> at(4, 0), src(4, 0);
      for (std::int64_t i = 0; i < y.numel(); ++i) {
        std::int64_t rest = i;
        for (std::size_t d = 4; d-- > 0;) {
          at[d] = rest % out[d];
          rest /= out[d];
        }
        for (std::size_t d = 0; d < 4; ++d) src[static_cast<std::size_t>(perm[d])] = at[d];
        const std::int64_t j =
            ((src[0] * shape[1] + src[1]) * shape[2] + src[2]) * shape[3] + src[3];
        ASSERT_EQ(y.data<float>()[static_cast<std::size_t>(i)],
                  x.data<float>()[static_cast<std::size_t>(j)])
            << fmt::format("dims [{}]{} at {}", fmt::join(perm, ","), on_team ? " on a team" : "",
                           i);
      }
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(ViewKernels, ReshapeKeepsTheBytesInCOrderAndResolvesMinusOne) {
  const Tensor x = random_tensor(DType::kFloat64, {6, 5}, 9);
  const Tensor y = compute({.type = OpType::kReshape, .shape = {3, -1, 5}}, {&x});
  ASSERT_EQ(y.shape(), (Shape{3, 2, 5}));
  EXPECT_EQ(std::memcmp(x.bytes(), y.bytes(), x.nbytes()), 0);
  const Tensor e(DType::kFloat32, {0, 4});
  EXPECT_EQ(compute({.type = OpType::kReshape, .shape = {4, 0, 3}}, {&e}).shape(),
            (Shape{4, 0, 3}));
}

Layout L(std::string_view mesh, std::string_view placements, Shape shape) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape));
}

TEST(ViewKernels, SliceIsNumPysBasicSliceAndItsGradientPadsWithZeros) {
  const Tensor x = random_tensor(DType::kFloat32, {2, 5, 3}, 7);
  const Op op{.type = OpType::kSlice, .dim = -2, .start = -4, .end = 9};  // NumPy's x[:, -4:9]
  const Tensor y = compute(op, {&x});
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 4; ++j)
      for (std::int64_t k = 0; k < 3; ++k)
        EXPECT_EQ(y.data<float>()[static_cast<std::size_t>((i * 4 + j) * 3 + k)],
                  x.data<float>()[static_cast<std::size_t>((i * 5 + j + 1) * 3 + k)]);
  const Op norm = normalize(op, {spec_of(x)});
  EXPECT_EQ(norm.dim, 1);
  EXPECT_EQ(norm.start, 1);
  EXPECT_EQ(norm.end, 5);
  EXPECT_EQ(to_string(norm), "slice(dim=1, start=1, end=5)");
  const Tensor back = compute(
      {.type = OpType::kSliceGrad, .dim = 1, .shape = {2, 5, 3}, .start = 1, .end = 5}, {&y});
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 5; ++j)
      for (std::int64_t k = 0; k < 3; ++k) {
        const auto at = static_cast<std::size_t>((i * 5 + j) * 3 + k);
        EXPECT_EQ(back.data<float>()[at], j == 0 ? 0.0f : x.data<float>()[at]);
      }
  // An empty range gives an empty dim; the sliced dim is never sharded, the others keep theirs.
  EXPECT_EQ(infer({.type = OpType::kSlice, .dim = 0, .start = 3, .end = 1}, {spec_of(x)}).shape,
            (Shape{0, 5, 3}));
  const DimLabels l = dim_labels(norm, {spec_of(x)});
  EXPECT_EQ(l.inputs[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(l.output, (std::vector<int>{0, 3, 2}));
  EXPECT_EQ(l.unshardable, (std::vector<int>{1, 3}));
  EXPECT_EQ(testing::error_of([&] { infer({.type = OpType::kSlice, .dim = 3}, {spec_of(x)}); }),
            "slice: dim 3 is out of range for a 3-d operand");
}

TEST(ReshapeKeepsShards, ExactlyWhenEveryDeviceHoldsTheSameFlatRange) {
  // [12, 8] -> [16, 6] on 4: rows 3 x 8 = 24 = 4 x 6 per device; a column shard is no block.
  EXPECT_TRUE(reshape_keeps_shards(L("4", "S(0)", {12, 8}), L("4", "S(0)", {16, 6})));
  EXPECT_FALSE(reshape_keeps_shards(L("4", "S(1)", {12, 8}), L("4", "S(0)", {16, 6})));
  // a split keeps the shard on the outer factor when the chunks agree
  EXPECT_TRUE(reshape_keeps_shards(L("4", "S(1)", {2, 16}), L("4", "S(1)", {2, 4, 4})));
  EXPECT_FALSE(reshape_keeps_shards(L("4", "S(1)", {2, 16}), L("4", "S(1)", {2, 2, 8})));
  // uneven: 10 rows over 4 are 3,3,3,1 rows of 6; 60 over 4 are 15 each
  EXPECT_TRUE(reshape_keeps_shards(L("4", "S(0)", {10, 6}), L("4", "S(0)", {10, 2, 3})));
  EXPECT_FALSE(reshape_keeps_shards(L("4", "S(0)", {10, 6}), L("4", "S(0)", {60})));
  // empty shards map to empty shards
  EXPECT_TRUE(reshape_keeps_shards(L("4", "S(0)", {2, 4}), L("4", "S(0)", {2, 2, 2})));
  // two mesh dims sharding one merged dim, outer mesh dim first
  EXPECT_TRUE(reshape_keeps_shards(L("2x2", "S(0),S(0)", {4, 6}), L("2x2", "S(0),S(0)", {24})));
  EXPECT_FALSE(reshape_keeps_shards(L("2x2", "S(0),S(1)", {4, 6}), L("2x2", "S(0),S(0)", {24})));
  // Partial and Replicate must match mesh dim by mesh dim
  EXPECT_TRUE(reshape_keeps_shards(L("4", "P(sum)", {24}), L("4", "P(sum)", {4, 6})));
  EXPECT_FALSE(reshape_keeps_shards(L("4", "P(sum)", {24}), L("4", "R", {4, 6})));
  EXPECT_FALSE(reshape_keeps_shards(L("4", "S(0)", {24}), L("4", "R", {4, 6})));
}

using testing::error_of;

TEST(ViewKernels, BadViewsAreOneClearErrorNamingTheOperator) {
  const Tensor x = random_tensor(DType::kFloat32, {3, 4}, 1);
  EXPECT_EQ(error_of([&] {
              compute({.type = OpType::kReshape, .shape = {5, 2}}, {&x});
            }),
            "reshape: cannot reshape 3x4 (12 elements) into 5x2 (10)");
  EXPECT_EQ(error_of([&] {
              compute({.type = OpType::kReshape, .shape = {5, -1}}, {&x});
            }),
            "reshape: cannot reshape 3x4 (12 elements) into 5x-1");
  EXPECT_EQ(error_of([&] {
              compute({.type = OpType::kReshape, .shape = {-1, -1}}, {&x});
            }),
            "reshape: shape -1x-1 has -1 (extents are >= 0, with at most one -1)");
  EXPECT_EQ(error_of([&] {
              compute({.type = OpType::kTranspose, .dims = {0, 0}}, {&x});
            }),
            "transpose: dims [0,0] are not a permutation of the 2 dims of the operand");
  EXPECT_EQ(error_of([&] { compute({.type = OpType::kTranspose, .dims = {0}}, {&x}); }),
            "transpose: dims [0] are not a permutation of the 2 dims of the operand");
  EXPECT_EQ(error_of([&] {
              compute({.type = OpType::kTranspose, .dims = {0, 2}}, {&x});
            }),
            "transpose: dims [0,2] are not a permutation of the 2 dims of the operand");
}

}  // namespace
}  // namespace meshflow
