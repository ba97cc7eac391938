// Event: a small copyable completion handle for asynchronous work. Work returns an Event; events
// merge with when_all; a failure travels with the event and is rethrown by wait; every wait
// takes a timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshflow {

// The shared state behind an Event: completed once, either successfully or with an error.
class EventState {
 public:
  // `what` names the work in timeout messages, e.g. "all_reduce on devices [0,1]".
  explicit EventState(std::string what) : what_(std::move(what)) {}

  // Marks the work done; wakes waiters. Later calls are ignored.
  void complete();
  // Marks the work failed with `error`; wakes waiters. Later calls are ignored.
  void fail(std::exception_ptr error);
  // For backends whose progress runs on the waiting thread (MPI): wait() and ready() call `poll`
  // until it returns true, then the event is complete. `poll` may throw to fail the event.
  void set_poll(std::function<bool()> poll);

  bool ready();
  // Returns when done; throws the failure, or Error(kTimeout) after `timeout`.
  void wait(std::chrono::milliseconds timeout);
  const std::string& what() const { return what_; }

 private:
  bool poll_locked(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<bool()> poll_;
  std::string what_;
};

class Event {
 public:
  // A complete event.
  Event() = default;
  explicit Event(std::shared_ptr<EventState> state) : states_{std::move(state)} {}

  // Returns true when all the work is done (successfully or not).
  bool ready() const;
  // Returns when all the work is done, within `timeout` in total; rethrows the first failure;
  // throws Error(kTimeout) naming the unfinished work.
  void wait(std::chrono::milliseconds timeout) const;

  // Returns an event that is done when every event in `events` is.
  friend Event when_all(const std::vector<Event>& events);

 private:
  std::vector<std::shared_ptr<EventState>> states_;
};

Event when_all(const std::vector<Event>& events);

}  // namespace meshflow
