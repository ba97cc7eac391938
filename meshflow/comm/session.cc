// Session: threads keeps one thread per device waiting on a job generation; mpi keeps this
// process's world communicator.
#include "meshflow/comm/session.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "meshflow/comm/threads/communicator.h"
#include "meshflow/core/error.h"
#ifdef MESHFLOW_HAVE_MPI
#include "meshflow/comm/mpi/communicator.h"
#include "meshflow/comm/mpi/launch.h"
#endif

namespace meshflow {

namespace {

// Devices 0..n-1 as threads, each waiting for the next job. Invariant: `pending` counts the
// selected devices still running the current job; a job starts only when it is 0.
class ThreadDevices {
 public:
  ThreadDevices(int n, Timeout timeout) : world_(first_devices(n), timeout), errors_(n) {
    for (int i = 0; i < n; ++i) {
      contexts_.push_back(std::make_unique<threads::DeviceContext>(world_, i));
      comms_.push_back(threads::world_communicator(*contexts_.back()));
    }
    selected_.assign(n, 0);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
  }

  ~ThreadDevices() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
    comms_.clear();
    contexts_.clear();  // drains each device's worker before the world goes
  }

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs one job; returns the first failing device's error (null when none failed).
  std::exception_ptr run(const std::vector<DeviceId>& devices,
                         const std::function<void(Communicator&)>& fn) {
    std::unique_lock lock(mu_);
    std::fill(selected_.begin(), selected_.end(), 0);
    for (DeviceId d : devices) selected_[d] = 1;
    pending_ = static_cast<int>(devices.size());
    job_ = &fn;
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (auto first = world_.first_failed()) return errors_[world_.index_of(*first)];
    return nullptr;
  }

 private:
  void loop(int i) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mu_);
    while (true) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (!selected_[i]) continue;
      const std::function<void(Communicator&)>* fn = job_;
      lock.unlock();
      errors_[i] = threads::run_device(world_, i, [&] { (*fn)(*comms_[i]); });
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }

  threads::World world_;
  std::vector<std::unique_ptr<threads::DeviceContext>> contexts_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  std::uint64_t generation_ = 0;
  const std::function<void(Communicator&)>* job_ = nullptr;
  std::vector<char> selected_;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace

struct Session::Impl {
  std::unique_ptr<ThreadDevices> threads;  // threads: started on first use, grown on demand
#ifdef MESHFLOW_HAVE_MPI
  std::unique_ptr<mpi::Watchdog> watchdog;
  std::unique_ptr<mpi::ProcessContext> process;
  std::shared_ptr<Communicator> world;
#endif
};

Session::Session(Backend backend, Timeout timeout)
    : backend_(backend), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  if (backend_ == Backend::kThreads) return;
#ifdef MESHFLOW_HAVE_MPI
  const int rank = mpi::world_rank();
  impl_->watchdog = std::make_unique<mpi::Watchdog>(rank);
  impl_->process = std::make_unique<mpi::ProcessContext>(
      mpi::ProcessContext{first_devices(mpi::world_size()), timeout_, impl_->watchdog.get(), {}});
  impl_->world = mpi::make_world_communicator(*impl_->process);
#else
  fail(ErrorKind::kInvalidArgument, "backend \"mpi\" was not built into this meshflow");
#endif
}

Session::~Session() {
#ifdef MESHFLOW_HAVE_MPI
  impl_->world.reset();
  if (impl_->process) impl_->process->groups.clear();
#endif
}

int Session::rank() const {
#ifdef MESHFLOW_HAVE_MPI
  if (backend_ == Backend::kMpi) return mpi::world_rank();
#endif
  return 0;
}

int Session::size() const {
#ifdef MESHFLOW_HAVE_MPI
  if (backend_ == Backend::kMpi) return mpi::world_size();
#endif
  return impl_->threads ? impl_->threads->size() : 0;
}

bool Session::drives(DeviceId device) const {
  return backend_ == Backend::kThreads || device == rank();
}

void Session::run(const std::vector<DeviceId>& devices,
                  const std::function<void(Communicator&)>& fn) {
  if (backend_ == Backend::kMpi) {
#ifdef MESHFLOW_HAVE_MPI
    mpi::check_in_world(devices);
    if (std::find(devices.begin(), devices.end(), rank()) != devices.end()) fn(*impl_->world);
#endif
    return;
  }
  DeviceId top = -1;
  for (DeviceId d : devices) {
    if (d < 0) fail(ErrorKind::kInvalidArgument, "device {} is not a device id", d);
    top = std::max(top, d);
  }
  if (top + 1 > kMaxThreadDevices) {
    fail(ErrorKind::kInvalidArgument,
         "device {} is beyond the threads backend's {} devices; run larger meshes under mpi", top,
         kMaxThreadDevices);
  }
  if (!impl_->threads || impl_->threads->size() < top + 1)
    impl_->threads = std::make_unique<ThreadDevices>(top + 1, timeout_);
  if (std::exception_ptr error = impl_->threads->run(devices, fn)) {
    impl_->threads.reset();  // a failed world stays failed: start fresh devices next time
    std::rethrow_exception(error);
  }
}

}  // namespace meshflow
