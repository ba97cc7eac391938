// Backend names and selection, and dispatch to the backend launchers.
#include "meshflow/comm/launch.h"

#include <algorithm>
#include <cstdlib>

#include "meshflow/comm/threads/launch.h"
#include "meshflow/core/error.h"
#ifdef MESHFLOW_HAVE_MPI
#include "meshflow/comm/mpi/launch.h"
#endif

namespace meshflow {

std::string_view to_string(Backend backend) { return backend == Backend::kMpi ? "mpi" : "threads"; }

bool mpi_available() {
#ifdef MESHFLOW_HAVE_MPI
  return true;
#else
  return false;
#endif
}

Backend parse_backend(std::string_view name) {
  if (name == "threads") return Backend::kThreads;
  if (name == "mpi") {
    if (!mpi_available())
      fail(ErrorKind::kInvalidArgument, "backend \"mpi\" was not built into this meshflow");
    return Backend::kMpi;
  }
  fail(ErrorKind::kInvalidArgument, "unknown backend \"{}\" (expected threads or mpi)", name);
}

Backend detect_backend() {
  return mpi_available() && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? Backend::kMpi
                                                                           : Backend::kThreads;
}

std::vector<DeviceId> first_devices(int n) {
  std::vector<DeviceId> ids(static_cast<std::size_t>(std::max(0, n)));
  for (int i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

bool prints_shared_errors() {
#ifdef MESHFLOW_HAVE_MPI
  if (detect_backend() == Backend::kMpi) return mpi::world_rank() == 0;
#endif
  return true;
}

void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  if (options.backend == Backend::kThreads) return threads::launch(options, fn);
#ifdef MESHFLOW_HAVE_MPI
  return mpi::launch(options, fn);
#else
  fail(ErrorKind::kInvalidArgument, "backend \"mpi\" was not built into this meshflow");
#endif
}

}  // namespace meshflow
