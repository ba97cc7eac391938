// A background thread that runs one job at a time: a device's next batch read while the current
// step computes.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace meshflow {

class BackgroundJob {
 public:
  BackgroundJob();
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;
  // Waits for the running job (its failure dropped) and ends the thread.
  ~BackgroundJob();

  // Starts `job` on the thread. Precondition: no job started and not yet waited for.
  void start(std::function<void()> job);
  // Returns whether a job was started and not yet waited for.
  bool pending() const { return pending_; }
  // Waits for the started job and rethrows its exception; returns the seconds waited.
  double wait();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = false, stop_ = false, pending_ = false, running_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace meshflow
