// The DTensor operator sweep on the mpi backend (run under mpirun -n 4): every operator, forward
// and backward, on fewer random layouts than the threads suite, checked the same way.
#include <gtest/gtest.h>

#include "tests/dtensor_check.h"

namespace meshflow {
namespace {

TEST(MpiDTensor, EveryOperatorMatchesTheSingleDeviceResultForwardAndBackward) {
  testing::check_every_operator(Backend::kMpi, 2);
}

}  // namespace
}  // namespace meshflow
