#include "meshflow/data/prefetch.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace meshflow {
namespace {

TEST(BackgroundJob, RunsEachJobAndHandsBackItsFailure) {
  BackgroundJob job;
  int value = 0;
  for (int i = 1; i <= 3; ++i) {
    job.start([&value, i] { value += i; });
    EXPECT_TRUE(job.pending());
    EXPECT_GE(job.wait(), 0.0);
    EXPECT_FALSE(job.pending());
  }
  EXPECT_EQ(value, 6);
  job.start([] { throw std::runtime_error("disk gone"); });
  EXPECT_THROW(job.wait(), std::runtime_error);
  job.start([&value] { value = 10; });
  job.wait();
  EXPECT_EQ(value, 10);
}

TEST(BackgroundJob, DestructionWaitsForARunningJob) {
  int value = 0;
  {
    BackgroundJob job;
    job.start([&value] { value = 1; });
  }
  EXPECT_EQ(value, 1);
}

}  // namespace
}  // namespace meshflow
