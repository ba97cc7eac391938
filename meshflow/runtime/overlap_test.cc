// The decomposed collective products (forward and backward) on threads, for 2, 3, 4 and 8 ranks
// (tests/overlap_check.h).
#include <gtest/gtest.h>

#include "tests/overlap_check.h"

namespace meshflow {
namespace {

TEST(Overlap,
     ColumnParallelLinearForwardAndBackwardEqualOneDeviceWithNMinus1PermutesOrNBroadcasts) {
  testing::check_allgather_product(Backend::kThreads, {2, 3, 4, 8});
}

TEST(Overlap, RowParallelMatmulForwardAndBackwardEqualOneDevice) {
  testing::check_product_reduce_scatter(Backend::kThreads, {2, 3, 4, 8});
}

}  // namespace
}  // namespace meshflow
