// The job thread: one job slot, a condition variable each way.
#include "meshflow/data/prefetch.h"

#include <utility>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"

namespace meshflow {

BackgroundJob::BackgroundJob() : thread_([this] { loop(); }) {}

BackgroundJob::~BackgroundJob() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !job_ && !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundJob::start(std::function<void()> job) {
  MESHFLOW_CHECK(!pending_, "a background job is already pending");
  {
    std::lock_guard lock(mu_);
    job_ = std::move(job);
    done_ = false;
    error_ = nullptr;
  }
  pending_ = true;
  cv_.notify_all();
}

double BackgroundJob::wait() {
  MESHFLOW_CHECK(pending_, "no background job to wait for");
  const double start = steady_seconds();
  std::exception_ptr error;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    error = std::exchange(error_, nullptr);
  }
  pending_ = false;
  const double waited = steady_seconds() - start;
  if (error) std::rethrow_exception(error);
  return waited;
}

void BackgroundJob::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || job_; });
    if (!job_) return;  // stopped with nothing to do
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    running_ = false;
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace meshflow
