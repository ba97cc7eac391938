// What every backend shares and nothing above it: the backend names, the options a launch takes
// and the one default timeout. Both threads/ and mpi/ include this, never the launcher above them.
#pragma once

#include <string_view>
#include <vector>

#include "meshflow/comm/communicator.h"

namespace meshflow {

enum class Backend { kThreads, kMpi };

// Returns "threads" or "mpi".
std::string_view to_string(Backend backend);
// Returns the backend named `name`; throws Error naming it otherwise (or when mpi is not built).
Backend parse_backend(std::string_view name);
// Returns kMpi when this process was started by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE),
// kThreads otherwise. The only place meshflow reads the environment.
Backend detect_backend();
// Returns true when the mpi backend was compiled in.
bool mpi_available();

// How long a collective waits for its peers before failing, unless told otherwise.
inline constexpr Timeout kDefaultTimeout{std::chrono::seconds(60)};

// The most device threads one threads launch starts (each device is two threads: its program
// and its collective worker); larger meshes run under mpi.
inline constexpr int kMaxThreadDevices = 512;

struct LaunchOptions {
  Backend backend = Backend::kThreads;
  // The devices to run, by id. Ids are labels: threads starts one thread per listed device
  // whatever the ids; under mpi the process of world rank r is device r, so every id must be
  // below the world size, and ranks not listed idle. Empty under mpi: the whole world.
  std::vector<DeviceId> devices;
  // How long a collective may wait for its peers before failing.
  Timeout timeout = kDefaultTimeout;
  // What this launch is about to do, as (name, value) pairs (e.g. the plan's text). Under mpi
  // every world rank compares them before the first collective and all fail together, naming
  // the first difference, when they disagree (ranks started with different arguments or files).
  // A value starting with "error: " is a failure this rank met while preparing: every rank then
  // fails with it.
  std::vector<std::pair<std::string, std::string>> agreement;
};

// Returns the device ids 0, 1, ..., n - 1.
std::vector<DeviceId> first_devices(int n);

}  // namespace meshflow
