// The MPI launcher. A device that throws prints its error and calls MPI_Abort, so its peers
// never wait for it forever.
#include "meshflow/comm/mpi/launch.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "meshflow/comm/mpi/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow::mpi {

namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(finalize_at_exit);
}

}  // namespace

int world_rank() {
  ensure_initialized();
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  ensure_initialized();
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  const int size = world_size(), rank = world_rank();
  const int devices = options.devices == 0 ? size : options.devices;
  if (devices < 1 || devices > size) {
    fail(ErrorKind::kInvalidArgument, "{} devices are needed but mpirun started {} processes",
         devices, size);
  }
  if (rank >= devices) return;  // a spare rank idles
  ProcessContext context{options.timeout, {}};
  try {
    auto comm = make_world_communicator(context, devices);
    fn(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshflow: error: device %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace meshflow::mpi
