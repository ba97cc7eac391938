// Session on the threads backend: every selected device runs the job once, on its own thread,
// with its own world communicator; a failing device fails the call and the next call starts on
// fresh devices; device ids are checked. (The mpi side runs under mpirun in the Python suite.)
#include "meshflow/comm/session.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow {
namespace {

TEST(Session, EverySelectedDeviceRunsOnceOnItsOwnThreadAndTheyMeet) {
  Session session(Backend::kThreads);
  EXPECT_EQ(session.rank(), 0);
  EXPECT_TRUE(session.drives(5));
  std::mutex mu;
  std::set<DeviceId> ran;
  std::set<std::thread::id> threads;
  const std::vector<DeviceId> devices{0, 2, 3};
  session.run(devices, [&](Communicator& comm) {
    // A barrier among the selected devices passes only if all of them run at once.
    barrier(*comm.group(devices));
    std::lock_guard lock(mu);
    EXPECT_TRUE(ran.insert(comm.device()).second) << "device " << comm.device() << " ran twice";
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ran, (std::set<DeviceId>{0, 2, 3}));
  EXPECT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(session.size(), 4);  // devices 0..3 started

  // A larger device id grows the devices; the same job runs again on every one.
  std::atomic<int> calls{0};
  session.run({0, 1, 2, 3, 4, 5}, [&](Communicator&) { ++calls; });
  EXPECT_EQ(calls.load(), 6);
  EXPECT_EQ(session.size(), 6);
}

TEST(Session, AFailingDeviceFailsTheCallAndTheNextCallRunsOnFreshDevices) {
  Session session(Backend::kThreads, Timeout(5000));
  const std::vector<DeviceId> devices{0, 1, 2};
  try {
    session.run(devices, [&](Communicator& comm) {
      if (comm.device() == 1) fail(ErrorKind::kInvalidArgument, "device 1 gave up (test)");
      barrier(*comm.group(devices));  // the others are released, not left waiting
    });
    ADD_FAILURE() << "the failure did not reach the caller";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 1 gave up"), std::string::npos) << e.what();
  }
  std::atomic<int> calls{0};
  session.run(devices, [&](Communicator& comm) {
    barrier(*comm.group(devices));
    ++calls;
  });
  EXPECT_EQ(calls.load(), 3);
}

TEST(Session, DeviceIdsOutsideTheBackendAreRefusedByName) {
  Session session(Backend::kThreads);
  try {
    session.run({0, -2}, [](Communicator&) {});
    ADD_FAILURE() << "device -2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-2"), std::string::npos) << e.what();
  }
  try {
    session.run({1 << 20}, [](Communicator&) {});
    ADD_FAILURE() << "device 1048576 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1048576"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshflow
