// The decomposed collective matmuls under mpirun -n 4, for 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include "tests/overlap_check.h"

namespace meshflow {
namespace {

TEST(MpiOverlap, AllGatherMatmulEqualsTheGemmInBothForms) {
  testing::check_allgather_matmul(Backend::kMpi, {2, 3, 4});
}

TEST(MpiOverlap, MatmulReduceScatterEqualsTheGemmsRowBlocks) {
  testing::check_matmul_reduce_scatter(Backend::kMpi, {2, 3, 4});
}

}  // namespace
}  // namespace meshflow
