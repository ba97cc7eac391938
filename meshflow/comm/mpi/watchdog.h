// The mpi backend's guard against a peer that stalls: a blocking MPI call has no timeout of its
// own, so while one runs a watchdog thread holds its deadline. Past it, the process prints one
// line naming the call and ends with exit status 1, which makes mpirun end every other process
// of the job: a stalled or dead peer fails the job within the timeout instead of hanging it.
// Device 0 reports at the deadline; other devices wait a grace period first, so that when device
// 0 is among the waiting ones the job ends with its single line.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace meshflow::mpi {

class Watchdog {
 public:
  // `device` is this process's world rank; it decides who reports first.
  explicit Watchdog(int device);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Holds a deadline while a blocking call runs.
  class Armed {
   public:
    Armed(Watchdog& dog, std::string what, std::chrono::milliseconds timeout);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    Watchdog& dog_;
  };

 private:
  void loop();

  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};
  std::string what_;
  std::thread thread_;
};

}  // namespace meshflow::mpi
