// The decomposed collective products (forward and backward) under mpirun -n 4, for 2, 3 and 4
// ranks.
#include <gtest/gtest.h>

#include "tests/overlap_check.h"

namespace meshflow {
namespace {

TEST(MpiOverlap, ColumnParallelLinearForwardAndBackward) {
  testing::check_allgather_product(Backend::kMpi, {2, 3, 4});
}

TEST(MpiOverlap, RowParallelMatmulForwardAndBackward) {
  testing::check_product_reduce_scatter(Backend::kMpi, {2, 3, 4});
}

}  // namespace
}  // namespace meshflow
