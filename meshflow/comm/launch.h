// Starting devices: run a function once per device on the chosen backend.
#pragma once

#include <functional>
#include <string_view>

#include "meshflow/comm/communicator.h"

namespace meshflow {

enum class Backend { kThreads, kMpi };

// Returns "threads" or "mpi".
std::string_view to_string(Backend backend);
// Returns the backend named `name`; throws Error naming it otherwise (or when mpi is not built).
Backend parse_backend(std::string_view name);
// Returns kMpi when this process was started by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE),
// kThreads otherwise. The only environment variable meshflow reads.
Backend detect_backend();
// Returns true when the mpi backend was compiled in.
bool mpi_available();

struct LaunchOptions {
  Backend backend = Backend::kThreads;
  // threads: the number of device threads. mpi: the number of devices (ranks 0..devices-1 run
  // `fn`; spare ranks idle); 0 means the whole world.
  int devices = 1;
  // How long a collective may wait for its peers before failing.
  Timeout timeout{std::chrono::seconds(60)};
};

// Runs fn(comm) once per device, comm spanning all devices (rank = device id). threads: returns
// when every device is done, rethrowing the first device's error (peers' collectives fail with
// an error naming that device rather than hanging). mpi: runs on this process's device; a device
// that throws prints its error and aborts the job, so no peer hangs.
void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn);

}  // namespace meshflow
