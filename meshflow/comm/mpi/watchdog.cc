// The watchdog thread. It never calls MPI (the library runs with MPI_THREAD_FUNNELED).
#include "meshflow/comm/mpi/watchdog.h"

#include <unistd.h>

#include <cstdio>

#include "meshflow/core/error.h"

namespace meshflow::mpi {

namespace {
// How much longer a device other than 0 waits before it reports, leaving device 0 the report.
constexpr std::chrono::seconds kReportGrace{2};
}  // namespace

Watchdog::Watchdog(int device) : device_(device), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Watchdog::Armed::Armed(Watchdog& dog, std::string what, std::chrono::milliseconds timeout)
    : dog_(dog) {
  {
    std::lock_guard lock(dog_.mu_);
    dog_.armed_ = true;
    ++dog_.generation_;
    dog_.timeout_ = timeout;
    dog_.deadline_ = std::chrono::steady_clock::now() + timeout +
                     (dog_.device_ == 0 ? std::chrono::milliseconds(0) : kReportGrace);
    dog_.what_ = std::move(what);
  }
  dog_.cv_.notify_all();
}

Watchdog::Armed::~Armed() {
  std::lock_guard lock(dog_.mu_);
  dog_.armed_ = false;
}

void Watchdog::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    const std::uint64_t generation = generation_;
    if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ && !stop_ &&
        generation == generation_) {
      std::fprintf(stderr,
                   "meshflow: error: device %d: %s timed out after %lld ms: a peer stalled or "
                   "died\n",
                   device_, what_.c_str(), static_cast<long long>(timeout_.count()));
      std::fflush(stderr);
      ::_exit(exit_status(ErrorKind::kTimeout));
    }
  }
}

}  // namespace meshflow::mpi
