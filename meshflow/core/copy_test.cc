#include "meshflow/core/copy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "meshflow/core/random.h"

namespace meshflow {
namespace {

TEST(CopyBytes, EveryStoreCopiesExactlyTheBytesAskedForAtAnyAlignment) {
  // Lengths around the cache line and destinations at every offset within one: streaming
  // stores cover whole lines only, ordinary ones the ends.
  const Tensor source = random_tensor(DType::kInt32, {2048}, 7);
  const auto* src = source.bytes();
  for (Store store : {Store::kCached, Store::kStreaming}) {
    for (std::size_t n : {0, 1, 63, 64, 127, 128, 129, 191, 1000, 4096}) {
      for (std::size_t dst_at : {0, 1, 15, 16, 33, 63}) {
        for (std::size_t src_at : {0, 3}) {
          std::vector<std::byte> got(n + 128, std::byte{0x5a});
          std::vector<std::byte> want = got;
          std::memcpy(want.data() + dst_at, src + src_at, n);
          copy_bytes(got.data() + dst_at, src + src_at, n, store);
          store_fence();
          EXPECT_EQ(got, want) << "store " << static_cast<int>(store) << " n " << n << " dst at "
                               << dst_at << " src at " << src_at;
        }
      }
    }
  }
}

// prepare_box_copy and run_box_copy are checked against an element-by-element reference in
// box_test.cc, beside copy_box.

TEST(BoxCopy, ChecksItsRegionsOnce) {
  const Tensor src(DType::kFloat32, {4, 4});
  Tensor dst(DType::kFloat32, {2, 2});
  EXPECT_THROW(prepare_box_copy(ConstBuffer{src.bytes(), &src.shape(), 4}, {3, 0},
                                MutableBuffer{dst.bytes(), &dst.shape(), 4}, {0, 0}, {2, 2}),
               Error);
  EXPECT_THROW(prepare_box_copy(ConstBuffer{src.bytes(), &src.shape(), 4}, {0, 0},
                                MutableBuffer{dst.bytes(), &dst.shape(), 8}, {0, 0}, {2, 2}),
               Error);
}

TEST(StoreForCopy, StreamsOnlyWhatFillsTheLastLevelCache) {
  const std::int64_t cache = last_level_cache_bytes();
  EXPECT_GE(cache, 0);
  EXPECT_EQ(store_for_copy_of(0), Store::kCached);
  EXPECT_EQ(store_for_copy_of(4096), Store::kCached);
  if (cache > 0) {
    EXPECT_EQ(store_for_copy_of(cache / 2 - 1), Store::kCached);
    EXPECT_EQ(store_for_copy_of(cache / 2), Store::kStreaming);
  }
}

}  // namespace
}  // namespace meshflow
