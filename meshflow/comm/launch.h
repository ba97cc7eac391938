// Starting devices: run a function once per device on the chosen backend.
#pragma once

#include <functional>

#include "meshflow/comm/backend.h"

namespace meshflow {

// Runs fn(comm) once per device, comm spanning all devices in the order options.devices lists
// them. threads: returns when every device is done, rethrowing the first device's error (peers'
// collectives fail with an error naming that device rather than hanging). mpi: every world rank
// first settles options.agreement (see LaunchOptions); then runs fn on this process's device; a
// device that throws prints its error and ends the job, and a collective that waits past the
// timeout ends it too, so no peer hangs.
void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn);

// Returns true where an error raised on every device at once (ErrorScope::kEveryDevice) is
// printed: always under threads; under mpi only on world rank 0, so the job prints it once.
bool prints_shared_errors();

}  // namespace meshflow
