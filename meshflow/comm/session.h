// Session: the devices this process drives, kept up between calls, for programs written once
// for every device (the global view of the Python module, as in JAX) rather than once per device
// inside a launch. threads: one thread per device (and its collective worker), waiting for jobs;
// mpi: this process's own device (world rank r is device r).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "meshflow/comm/backend.h"

namespace meshflow {

class Session {
 public:
  // The backend the process was started for (detect_backend) unless told otherwise.
  explicit Session(Backend backend = detect_backend(), Timeout timeout = kDefaultTimeout);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Backend backend() const { return backend_; }
  // This process's MPI world rank (mpi), 0 (threads).
  int rank() const;
  // The number of MPI processes (mpi), of devices started so far (threads).
  int size() const;
  // Returns true when `device` is driven by this process: every device on threads, device
  // rank() under mpi.
  bool drives(DeviceId device) const;

  // Runs fn(comm) for every device of `devices` this process drives, each with its world
  // communicator, and returns when all are done. threads: concurrently on the devices' threads
  // (device threads start on first use, up to kMaxThreadDevices); a device that throws fails
  // its peers' collectives, and the first device's error is rethrown here once every device is
  // done (the devices are then restarted for the next call). mpi: fn runs on the calling thread.
  // Not reentrant: fn must not call run.
  void run(const std::vector<DeviceId>& devices, const std::function<void(Communicator&)>& fn);

  struct Impl;  // the backend's state (comm/session.cc)

 private:
  Backend backend_;
  Timeout timeout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshflow
