#include "meshflow/core/event.h"

#include <gtest/gtest.h>

#include <thread>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

using std::chrono::milliseconds;

TEST(Event, DefaultIsCompleteAndCompletionWakesWaiters) {
  Event().wait(milliseconds(0));
  auto state = std::make_shared<EventState>("work");
  Event e(state);
  EXPECT_FALSE(e.ready());
  std::thread t([state] { state->complete(); });
  e.wait(milliseconds(10000));
  EXPECT_TRUE(e.ready());
  t.join();
}

TEST(Event, TimeoutNamesTheWork) {
  Event e(std::make_shared<EventState>("all_gather on devices [0,1]"));
  try {
    e.wait(milliseconds(20));
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(err.what()).find("all_gather on devices [0,1]"), std::string::npos);
  }
}

TEST(Event, FailureTravelsThroughWhenAll) {
  auto a = std::make_shared<EventState>("a");
  auto b = std::make_shared<EventState>("b");
  Event both = when_all({Event(a), Event(b)});
  a->complete();
  EXPECT_FALSE(both.ready());
  b->fail(std::make_exception_ptr(Error(ErrorKind::kCommunication, "device 2 failed")));
  EXPECT_TRUE(both.ready());
  EXPECT_THROW(both.wait(milliseconds(10)), Error);
}

TEST(Event, PollDrivesCompletionOnTheWaitingThread) {
  auto s = std::make_shared<EventState>("polled");
  int calls = 0;
  s->set_poll([&calls] { return ++calls == 3; });
  Event(s).wait(milliseconds(1000));
  EXPECT_EQ(calls, 3);
  auto bad = std::make_shared<EventState>("polled");
  bad->set_poll([]() -> bool { throw Error(ErrorKind::kCommunication, "mpi said no"); });
  EXPECT_THROW(Event(bad).wait(milliseconds(1000)), Error);
}

}  // namespace
}  // namespace meshflow
