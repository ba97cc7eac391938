#include "meshflow/core/box.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "meshflow/core/compare.h"
#include "meshflow/core/copy.h"
#include "meshflow/core/random.h"

namespace meshflow {
namespace {

// Reference: element-by-element copy through flat indices.
void naive_copy(const Tensor& src, const Box& box, Tensor& dst,
                const std::vector<std::int64_t>& at) {
  auto ss = row_major_strides(src.shape());
  auto ds = row_major_strides(dst.shape());
  auto s = src.data<float>();
  auto d = dst.data<float>();
  std::vector<std::int64_t> idx(box.extent.size(), 0);
  for (std::int64_t n = 0; n < numel(box); ++n) {
    std::int64_t rem = n, si = 0, di = 0;
    for (std::size_t k = box.extent.size(); k-- > 0;) {
      std::int64_t i = rem % box.extent[k];
      rem /= box.extent[k];
      si += (box.offset[k] + i) * ss[k];
      di += (at[k] + i) * ds[k];
    }
    d[di] = s[si];
  }
}

TEST(Box, IntersectAndContain) {
  Box a{{0, 2}, {4, 4}};
  Box b{{2, 0}, {4, 3}};
  EXPECT_EQ(intersect(a, b), (Box{{2, 2}, {2, 1}}));
  EXPECT_EQ(numel(intersect(Box{{0}, {2}}, Box{{5}, {2}})), 0);
  EXPECT_TRUE(contains(a, Box{{1, 3}, {2, 2}}));
  EXPECT_FALSE(contains(a, Box{{1, 3}, {2, 4}}));
  EXPECT_EQ(to_string(a), "[0:4, 2:6]");
}

TEST(CopyBox, MatchesElementwiseReferenceOnRandomRegions) {
  // copy_box, and the same copy prepared once and run in random ranges of rows (last to first,
  // cached and streaming stores in turn), each into a destination with guard elements on both
  // sides that must stay untouched. Empty dims anywhere are among the regions.
  constexpr std::int64_t kGuard = 32;
  constexpr float kSentinel = -12345.5F;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 600; ++trial) {
    SCOPED_TRACE("seed 1234 trial " + std::to_string(trial));
    const std::size_t rank = rng() % 5;
    Shape src_shape(rank), dst_shape(rank);
    Box box{std::vector<std::int64_t>(rank), std::vector<std::int64_t>(rank)};
    std::vector<std::int64_t> at(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      src_shape[d] = rng() % 6;
      box.extent[d] = src_shape[d] ? rng() % (src_shape[d] + 1) : 0;
      box.offset[d] = rng() % (src_shape[d] - box.extent[d] + 1);
      dst_shape[d] = box.extent[d] + rng() % 3;
      at[d] = rng() % (dst_shape[d] - box.extent[d] + 1);
    }
    const Tensor src = random_tensor(DType::kFloat32, src_shape, trial);
    const Tensor before = random_tensor(DType::kFloat32, dst_shape, trial + 1000);
    Tensor want = before.clone();
    naive_copy(src, box, want, at);
    for (bool in_ranges : {false, true}) {
      SCOPED_TRACE(in_ranges ? "prepared, in row ranges" : "copy_box");
      std::vector<float> guarded(before.numel() + 2 * kGuard, kSentinel);
      std::ranges::copy(before.data<float>(), guarded.begin() + kGuard);
      const ConstBuffer from{src.bytes(), &src.shape(), 4};
      const MutableBuffer to{reinterpret_cast<std::byte*>(guarded.data() + kGuard), &dst_shape, 4};
      if (!in_ranges) {
        copy_box(from, box.offset, to, at, box.extent);
      } else {
        const BoxCopy copy = prepare_box_copy(from, box.offset, to, at, box.extent);
        std::vector<std::int64_t> cuts{0, box_copy_rows(copy)};
        for (int c = 0; c < 3; ++c) cuts.push_back(rng() % (box_copy_rows(copy) + 1));
        std::sort(cuts.begin(), cuts.end());
        for (std::size_t i = cuts.size() - 1; i-- > 0;) {
          run_box_copy(copy, cuts[i], cuts[i + 1] - cuts[i],
                       i % 2 ? Store::kStreaming : Store::kCached);
        }
        store_fence();
      }
      for (std::int64_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(guarded[i], kSentinel) << "written before the destination";
        ASSERT_EQ(guarded[guarded.size() - 1 - i], kSentinel) << "written after the destination";
      }
      EXPECT_TRUE(
          std::ranges::equal(want.data<float>(), std::span(guarded).subspan(kGuard, want.numel())));
    }
  }
}

TEST(CopyBox, RegionOutsideShapeIsRejected) {
  Tensor src(DType::kFloat32, {4, 4});
  Tensor dst(DType::kFloat32, {2, 2});
  EXPECT_THROW(copy_box(src, Box{{3, 0}, {2, 2}}, dst, {0, 0}), Error);
  EXPECT_THROW(copy_box(src, Box{{0, 0}, {2, 2}}, dst, {1, 0}), Error);
  Tensor other(DType::kInt32, {2, 2});
  EXPECT_THROW(copy_box(src, Box{{0, 0}, {2, 2}}, other, {0, 0}), Error);
}

TEST(Slice, TakesTheRegion) {
  Tensor src = random_tensor(DType::kFloat32, {3, 4}, 5);
  Tensor s = slice(src, Box{{1, 1}, {2, 2}});
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.data<float>()[3], src.data<float>()[2 * 4 + 2]);
}

TEST(Box, ContiguousRunsAreTheFewestRunsContiguousInEveryOuterBox) {
  const Box outer{{0, 0, 0}, {4, 6, 8}};
  // Whole trailing dims: one run per index of dim 0.
  const Box rows{{1, 0, 0}, {2, 6, 8}};
  EXPECT_EQ(contiguous_runs(rows, {outer}), (std::vector<Box>{{{1, 0, 0}, {2, 6, 8}}}))
      << "dims 1 and 2 whole: the part is one run";
  // Part of the last dim: one run per (i, j), in row-major order.
  const Box cols{{1, 2, 3}, {2, 2, 4}};
  const std::vector<Box> runs = contiguous_runs(cols, {outer});
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0], (Box{{1, 2, 3}, {1, 1, 4}}));
  EXPECT_EQ(runs[3], (Box{{2, 3, 3}, {1, 1, 4}}));
  for (const Box& r : runs) EXPECT_TRUE(contiguous_offset(r, outer).has_value());
  // Whole in one outer box but not in the other: the runs follow the narrower.
  const Box narrow{{0, 0, 0}, {4, 6, 4}};
  const Box half{{0, 0, 0}, {2, 6, 4}};
  EXPECT_EQ(contiguous_runs(half, {narrow}).size(), 1u);
  EXPECT_EQ(contiguous_runs(half, {narrow, outer}).size(), 12u);
  EXPECT_EQ(contiguous_runs(Box{}, {Box{}}).size(), 1u) << "a scalar";
}

}  // namespace
}  // namespace meshflow
