// The decomposed collective matmuls on threads, for 2, 3, 4 and 8 ranks (tests/overlap_check.h).
#include <gtest/gtest.h>

#include "tests/overlap_check.h"

namespace meshflow {
namespace {

TEST(Overlap, AllGatherMatmulEqualsTheGemmInBothFormsWithNMinus1PermutesOrNBroadcasts) {
  testing::check_allgather_matmul(Backend::kThreads, {2, 3, 4, 8});
}

TEST(Overlap, MatmulReduceScatterEqualsTheGemmsRowBlocksWithNMinus1Permutes) {
  testing::check_matmul_reduce_scatter(Backend::kThreads, {2, 3, 4, 8});
}

}  // namespace
}  // namespace meshflow
