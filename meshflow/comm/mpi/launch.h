// Starting the `mpi` backend: this process is device MPI world rank.
#pragma once

#include <functional>

#include "meshflow/comm/backend.h"

namespace meshflow::mpi {

// Runs fn(comm) on this process if its world rank is below options.devices (0 = the world);
// see meshflow::launch. Initialises MPI on first use and finalises it at exit.
void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn);

// Throws Error, alike on every rank, naming the first device of `devices` that is not a rank of
// the MPI world.
void check_in_world(const std::vector<DeviceId>& devices);

// Returns this process's MPI world rank and size, initialising MPI if needed.
int world_rank();
int world_size();

}  // namespace meshflow::mpi
