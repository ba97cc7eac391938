#include "bench/floor.h"

#include <gtest/gtest.h>

#include <cstring>

#include "meshflow/core/random.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow::bench {
namespace {

// Returns the destination's bytes [begin, begin + n) equal to `want`'s.
bool same_bytes(const MemoryFloor& f, std::int64_t begin, const std::byte* want, std::int64_t n) {
  return std::memcmp(f.destination().bytes() + begin, want, static_cast<std::size_t>(n)) == 0;
}

bool zero_bytes(const MemoryFloor& f, std::int64_t begin, std::int64_t n) {
  for (std::int64_t i = begin; i < begin + n; ++i) {
    if (f.destination().bytes()[i] != std::byte{0}) return false;
  }
  return true;
}

// Each case on one thread and on a team of three, whose parts split every piece.
class MemoryFloorTest : public ::testing::TestWithParam<int> {
 protected:
  void run(MemoryFloor& f) {
    ThreadTeam team(GetParam());
    const UseTeam use(&team);
    f.run();
  }
};

TEST_P(MemoryFloorTest, ReductionCopiesWhatFitsAndReadsTheRest) {
  // Two operands of 1000 and 357 floats, 1100 floats of results: the first operand copied
  // whole, the second's first 100 floats after it, its other 257 read alone.
  const Tensor a = random_tensor(DType::kFloat32, {1000}, 1);
  const Tensor b = random_tensor(DType::kFloat32, {357}, 2);
  MemoryFloor f({{&a}, {&b}}, 1100 * 4);
  EXPECT_EQ(f.bytes(), (1000 + 357 + 1100) * 4);
  run(f);
  EXPECT_TRUE(same_bytes(f, 0, a.bytes(), 4000));
  EXPECT_TRUE(same_bytes(f, 4000, b.bytes(), 400));
}

TEST_P(MemoryFloorTest, ScatterZeroesWhatNoOperandFills) {
  // A table of 5003 floats from 1201 floats of gradient and a prefix of 24 bytes of ids.
  const Tensor ids = random_tensor(DType::kFloat32, {40}, 3);
  const Tensor g = random_tensor(DType::kFloat32, {1201}, 4);
  MemoryFloor f({{&ids, 24}, {&g}}, 5003 * 4);
  EXPECT_EQ(f.bytes(), 24 + 1201 * 4 + 5003 * 4);
  ASSERT_FALSE(zero_bytes(f, 24 + 1201 * 4, 4));  // not zero before the run
  run(f);
  EXPECT_TRUE(same_bytes(f, 0, ids.bytes(), 24));
  EXPECT_TRUE(same_bytes(f, 24, g.bytes(), 1201 * 4));
  EXPECT_TRUE(zero_bytes(f, 24 + 1201 * 4, 5003 * 4 - 24 - 1201 * 4));
}

INSTANTIATE_TEST_SUITE_P(Threads, MemoryFloorTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace meshflow::bench
