#include "meshflow/core/clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace meshflow {
namespace {

// A thread's CPU clock advances while it computes and stands still while it sleeps; the steady
// clock advances through both.
TEST(Clock, ThreadCpuSecondsCountWorkAndNotSleep) {
  const double cpu = thread_cpu_seconds(), wall = steady_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GE(steady_seconds() - wall, 0.05);
  EXPECT_LT(thread_cpu_seconds() - cpu, 0.02);

  // Compute until this thread has run 20 ms (however busy the machine), within 10 s.
  const double busy = thread_cpu_seconds(), limit = steady_seconds() + 10;
  volatile double sink = 1;
  while (thread_cpu_seconds() - busy < 0.02 && steady_seconds() < limit) sink = sink * 1.0000001;
  EXPECT_GE(thread_cpu_seconds() - busy, 0.02);
}

}  // namespace
}  // namespace meshflow
