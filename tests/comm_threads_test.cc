// The conformance suite on the threads backend (2, 3, 4 and 8 devices), plus what only threads
// can test in-process: a failing device, a device that never arrives, mismatched arguments.
#include <gtest/gtest.h>

#include <thread>

#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "tests/comm_conformance.h"

namespace meshflow {
namespace {

using std::chrono::milliseconds;

struct Param {
  const conformance::Check* check;
  int devices;
};

// Names the parameter in test listings (ctest shows it beside each test).
void PrintTo(const Param& p, std::ostream* os) {
  *os << p.check->name << " on " << p.devices << " devices";
}

class ThreadsConformance : public ::testing::TestWithParam<Param> {};

TEST_P(ThreadsConformance, Runs) {
  const Param& p = GetParam();
  launch({.backend = Backend::kThreads,
          .devices = first_devices(p.devices),
          .timeout = std::chrono::seconds(60)},
         [&](Communicator& comm) {
           p.check->run(comm, conformance::Env{.rank_order_reductions = true});
         });
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const auto& c : conformance::checks()) {
    for (int n : {2, 3, 4, 8}) out.push_back({&c, n});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Checks, ThreadsConformance, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return p.param.check->name + "_" + std::to_string(p.param.devices) +
                                  "devices";
                         });

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ThreadsFailure, AFailingDeviceFailsItsPeersCollectivesAndIsRethrown) {
  std::atomic<int> peers_failed{0};
  std::string launched = message_of([&] {
    launch({.backend = Backend::kThreads,
            .devices = first_devices(4),
            .timeout = std::chrono::seconds(30)},
           [&](Communicator& comm) {
             if (comm.device() == 2)
               throw Error(ErrorKind::kInvalidArgument, "bad shard on device 2");
             std::vector<float> x(8, 1.0f);
             std::string m = message_of([&] {
               all_reduce(comm, {.send = reinterpret_cast<std::byte*>(x.data()),
                                 .recv = reinterpret_cast<std::byte*>(x.data()),
                                 .count = 8});
             });
             EXPECT_NE(m.find("device 2 failed: bad shard on device 2"), std::string::npos) << m;
             EXPECT_NE(m.find("all_reduce on devices [0,1,2,3]"), std::string::npos) << m;
             ++peers_failed;
           });
  });
  EXPECT_EQ(launched, "bad shard on device 2");
  EXPECT_EQ(peers_failed.load(), 3);
}

TEST(ThreadsFailure, ACollectiveThatWaitsTooLongNamesTheMissingDevice) {
  const auto start = std::chrono::steady_clock::now();
  launch({.backend = Backend::kThreads, .devices = first_devices(4), .timeout = milliseconds(500)},
         [&](Communicator& comm) {
           std::vector<std::int64_t> counts(4, 1);
           std::vector<float> send(1, 1.0f), recv(4);
           auto gather = [&] {
             all_gather(comm, {.send = reinterpret_cast<std::byte*>(send.data()),
                               .recv = reinterpret_cast<std::byte*>(recv.data()),
                               .recv_counts = counts});
           };
           if (comm.device() == 3) {
             std::this_thread::sleep_for(milliseconds(2500));
             std::string late = message_of(gather);
             EXPECT_NE(late.find("abandoned"), std::string::npos) << late;
             return;
           }
           std::string m = message_of(gather);
           EXPECT_NE(m.find("all_gather on devices [0,1,2,3] timed out after 500 ms: devices [3] "
                            "never arrived"),
                     std::string::npos)
               << m;
         });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ThreadsFailure, ADeviceThatFinishesWithoutJoiningIsNamed) {
  launch({.backend = Backend::kThreads,
          .devices = first_devices(3),
          .timeout = std::chrono::seconds(30)},
         [&](Communicator& comm) {
           if (comm.device() == 0) return;
           std::string m = message_of([&] { barrier(comm); });
           EXPECT_NE(m.find("device 0 finished its program without joining it"), std::string::npos)
               << m;
         });
}

TEST(ThreadsFailure, MismatchedArgumentsAreErrorsNotCorruption) {
  launch({.backend = Backend::kThreads, .devices = first_devices(2)}, [&](Communicator& comm) {
    std::vector<float> a(4), b(8);
    std::string m = message_of([&] {
      all_reduce(comm, {.send = reinterpret_cast<std::byte*>(a.data()),
                        .recv = reinterpret_cast<std::byte*>(a.data()),
                        .count = comm.rank() == 0 ? 4 : 3});
    });
    EXPECT_NE(m.find("disagree on count"), std::string::npos) << m;
    m = message_of([&] {
      all_gather(comm, {.send = nullptr, .recv = nullptr, .recv_counts = {1, 2, 3}});
    });
    EXPECT_NE(m.find("recv_counts has 3 entries but the group has 2 ranks"), std::string::npos)
        << m;
    m = message_of([&] { (void)comm.group({0, 0}); });
    EXPECT_NE(m.find("listed twice"), std::string::npos) << m;
    m = message_of([&] { (void)comm.group({comm.device() == 0 ? 1 : 0}); });
    EXPECT_NE(m.find("is not a member"), std::string::npos) << m;
  });
}

}  // namespace
}  // namespace meshflow
