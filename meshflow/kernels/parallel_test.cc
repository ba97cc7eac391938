#include "meshflow/kernels/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "meshflow/kernels/float_mode.h"

namespace meshflow {
namespace {

TEST(ParallelTest, WithoutATeamEverythingRunsOnTheCaller) {
  EXPECT_EQ(team_threads(), 1);
  std::vector<std::pair<std::int64_t, std::int64_t>> parts;
  parallel_for(1000000, 1, [&](std::int64_t b, std::int64_t e) { parts.emplace_back(b, e); });
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], std::make_pair(std::int64_t{0}, std::int64_t{1000000}));
}

TEST(ParallelTest, PartsCoverTheRangeOnceOnDistinctThreads) {
  ThreadTeam team(3);
  const UseTeam use(&team);
  EXPECT_EQ(team_threads(), 3);
  for (std::int64_t n : {0, 1, 5, 47, 1000, 123457}) {
    std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
    std::mutex mu;
    std::set<std::thread::id> threads;
    parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) ++seen[static_cast<std::size_t>(i)];
      std::lock_guard lock(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], 1) << n;
    EXPECT_LE(threads.size(), 3u);
    if (n >= 3) {
      EXPECT_EQ(threads.size(), 3u) << n;
    }
  }
  // 200,000 elements at a grain of 100,000: two parts, not three.
  EXPECT_EQ(parallel_parts(200000, 100000), 2);
  EXPECT_EQ(parallel_parts(10, 100000), 1);
}

TEST(ParallelTest, BoundariesAreAlignedAndOrdered) {
  for (int parts : {1, 2, 3, 7}) {
    std::int64_t last = 0;
    for (int p = 1; p <= parts; ++p) {
      const std::int64_t b = part_begin(100003, parts, p);
      EXPECT_GE(b, last);
      if (p < parts) {
        EXPECT_EQ(b % 16, 0);
      }
      last = b;
    }
    EXPECT_EQ(last, 100003);
  }
}

TEST(ParallelTest, APartRunsNestedLoopsAlone) {
  ThreadTeam team(2);
  const UseTeam use(&team);
  std::atomic<int> inner_threads{0};
  parallel_for(100, 1, [&](std::int64_t, std::int64_t) { inner_threads += team_threads(); });
  EXPECT_EQ(inner_threads, 2);  // each of the two parts saw a team of 1
  EXPECT_EQ(team_threads(), 2);
}

TEST(ParallelTest, TheFirstErrorIsRethrownAfterEveryPartRan) {
  ThreadTeam team(4);
  const UseTeam use(&team);
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_for(4, 1,
                            [&](std::int64_t b, std::int64_t) {
                              ++ran;
                              if (b >= 2) throw std::runtime_error("bad part");
                            }),
               std::runtime_error);
  EXPECT_EQ(ran, 4);
  // The team still works after a failure.
  std::atomic<std::int64_t> sum{0};
  parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) {
    std::int64_t s = 0;
    for (std::int64_t i = b; i < e; ++i) s += i;
    sum += s;
  });
  EXPECT_EQ(sum, 999 * 1000 / 2);
}

TEST(ParallelTest, ManyShortRunsInARow) {
  ThreadTeam team(2);
  const UseTeam use(&team);
  std::atomic<std::int64_t> total{0};
  for (int i = 0; i < 2000; ++i)
    parallel_for(64, 1, [&](std::int64_t b, std::int64_t e) { total += e - b; });
  EXPECT_EQ(total, 2000 * 64);
}

// Runs that find the helpers watching and runs that find them asleep (after more than
// kTeamWatch idle), in turn: every part runs once either way, on its own thread, and the
// caller sees every part's writes.
TEST(ParallelTest, RunsFindTheHelpersWatchingOrAsleep) {
  ThreadTeam team(3);
  const UseTeam use(&team);
  for (int round = 0; round < 6; ++round) {
    if (round % 2 == 1) std::this_thread::sleep_for(kTeamWatch * 5);
    std::vector<std::int64_t> wrote(3, -1);
    std::vector<std::thread::id> who(3);
    parallel_parts_for(3000, 3, [&](int part, std::int64_t b, std::int64_t e) {
      wrote[static_cast<std::size_t>(part)] = e - b;
      who[static_cast<std::size_t>(part)] = std::this_thread::get_id();
    });
    EXPECT_EQ(wrote[0] + wrote[1] + wrote[2], 3000) << "round " << round;
    EXPECT_NE(who[0], who[1]);
    EXPECT_NE(who[1], who[2]);
    EXPECT_NE(who[0], who[2]);
  }
}

TEST(ParallelTest, HelpersRunInTheCallersFloatMode) {
  ThreadTeam team(2);
  const UseTeam use(&team);
  const FlushDenormals flush;
  std::atomic<int> flushing{0};
  const unsigned mine = float_mode();
  parallel_for(2, 1, [&](std::int64_t, std::int64_t) { flushing += float_mode() == mine; });
  EXPECT_EQ(flushing, 2);
}

}  // namespace
}  // namespace meshflow
