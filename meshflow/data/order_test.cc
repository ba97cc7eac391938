#include "meshflow/data/order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "meshflow/core/random.h"

namespace meshflow {
namespace {

TEST(Order, SequentialRowsReadUnitsInTurnAcrossEpochs) {
  ShuffleCache cache;
  const RowOrder o{.order = DataOrder::kSequential, .units = 5, .window = 8};
  EXPECT_EQ(row_positions(o, 3, 5, cache), (std::vector<std::int64_t>{24, 32, 0, 8, 16}));
  EXPECT_EQ(cache.bytes(), 0);
}

TEST(Order, ShuffledEpochVisitsEveryUnitOnceAndEpochsDiffer) {
  ShuffleCache cache;
  const RowOrder o{.order = DataOrder::kShuffled, .seed = 7, .units = 100, .window = 1};
  const std::vector<std::int64_t> first = row_positions(o, 0, 100, cache);
  const std::vector<std::int64_t> second = row_positions(o, 100, 100, cache);
  std::set<std::int64_t> seen(first.begin(), first.end());
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(*seen.rbegin(), 99);
  EXPECT_NE(first, second);
  std::vector<std::int64_t> sorted = second;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t u = 0; u < 100; ++u) EXPECT_EQ(sorted[static_cast<std::size_t>(u)], u);
  EXPECT_EQ(cache.bytes(), 400);
  // A batch straddling the boundary reads the end of one epoch and the start of the next.
  const std::vector<std::int64_t> straddle = row_positions(o, 98, 4, cache);
  EXPECT_EQ(straddle, (std::vector<std::int64_t>{first[98], first[99], second[0], second[1]}));
  // A device behind the others reads the earlier epoch rightly; the newest one stays cached.
  EXPECT_EQ(row_positions(o, 150, 1, cache)[0], second[50]);
  EXPECT_EQ(row_positions(o, 10, 1, cache)[0], first[10]);
  EXPECT_EQ(*cache.epoch(o, 1), *cache.epoch(o, 1));
  EXPECT_EQ(cache.epoch(o, 1).get(), cache.epoch(o, 1).get());
}

// The permutation sorts units by Philox's 64-bit key under key (seed, epoch + 1).
TEST(Order, ShuffledUnitsAreSortedByPhiloxKeys) {
  const std::uint32_t seed = 3;
  const std::vector<std::uint32_t> pi = shuffled_units(seed, 2, 50);
  for (std::size_t i = 1; i < pi.size(); ++i) {
    auto key = [&](std::uint32_t u) {
      const auto w = philox4x32_10({u, 0, 0, 0}, {seed, 3});
      return (std::uint64_t{w[0]} << 32) | w[1];
    };
    EXPECT_LT(key(pi[i - 1]), key(pi[i]));
  }
}

TEST(Order, RandomStartsAreInRangeAndSeeded) {
  ShuffleCache cache;
  const RowOrder o{.order = DataOrder::kRandom, .seed = 1, .units = 10, .starts = 37};
  const std::vector<std::int64_t> a = row_positions(o, 0, 200, cache);
  for (std::int64_t p : a) {
    EXPECT_GE(p, 0);
    EXPECT_LT(p, 37);
  }
  EXPECT_EQ(a, row_positions(o, 0, 200, cache));
  RowOrder other = o;
  other.seed = 2;
  EXPECT_NE(a, row_positions(other, 0, 200, cache));
  const auto w = philox4x32_10({5, 0, 0, 0}, {1, 0xFFFFFFFFu});
  EXPECT_EQ(a[5], static_cast<std::int64_t>(((std::uint64_t{w[0]} << 32) | w[1]) % 37));
}

}  // namespace
}  // namespace meshflow
