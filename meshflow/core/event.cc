// Event completion and waiting.
#include "meshflow/core/event.h"

#include <thread>

#include "meshflow/core/error.h"

namespace meshflow {

void EventState::complete() {
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
  }
  cv_.notify_all();
}

void EventState::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void EventState::set_poll(std::function<bool()> poll) {
  std::lock_guard lock(mu_);
  poll_ = std::move(poll);
}

bool EventState::poll_locked(std::unique_lock<std::mutex>& lock) {
  if (done_ || !poll_) return done_;
  try {
    if (poll_()) done_ = true;
  } catch (...) {
    done_ = true;
    error_ = std::current_exception();
  }
  if (done_) poll_ = nullptr;
  (void)lock;
  return done_;
}

bool EventState::ready() {
  std::unique_lock lock(mu_);
  return poll_locked(lock);
}

void EventState::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mu_);
  if (poll_) {
    while (!poll_locked(lock)) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  } else {
    cv_.wait_until(lock, deadline, [&] { return done_; });
  }
  if (!done_) {
    ::meshflow::fail(ErrorKind::kTimeout, "{} did not finish within {} ms", what_, timeout.count());
  }
  if (error_) std::rethrow_exception(error_);
}

bool Event::ready() const {
  for (const auto& s : states_) {
    if (!s->ready()) return false;
  }
  return true;
}

void Event::wait(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& s : states_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    s->wait(std::max(left, std::chrono::milliseconds(0)));
  }
}

Event when_all(const std::vector<Event>& events) {
  Event out;
  for (const Event& e : events)
    out.states_.insert(out.states_.end(), e.states_.begin(), e.states_.end());
  return out;
}

}  // namespace meshflow
