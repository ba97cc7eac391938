// The decomposed collective products (forward and backward) on threads, for 2, 3, 4 and 8 ranks
// (tests/overlap_check.h).
#include "meshflow/runtime/overlap.h"

#include <gtest/gtest.h>

#include "meshflow/comm/recording.h"
#include "meshflow/core/random.h"
#include "tests/error_of.h"
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

TEST(Overlap, TheInPlaceFormNeedsDevicesThatShareMemory) {
  // A recording communicator alone moves no data and shares nothing.
  RecordingCommunicator alone({0, 1}, 0, std::make_shared<CallLog>());
  const Tensor x = random_tensor(DType::kFloat32, {2, 3}, 1);
  const Tensor w = random_tensor(DType::kFloat32, {3, 4}, 2);
  const Tensor* rest[] = {&w};
  EXPECT_EQ(testing::error_of([&] {
              allgather_product(alone, Op{.type = OpType::kMatmul}, x, 4, rest,
                                {.form = GatherForm::kInPlace});
            }),
            "the in_place form reads peers' blocks where they lie, but allgather_product on "
            "devices [0,1] on the recording backend does not share memory");
}

}  // namespace
}  // namespace meshflow
