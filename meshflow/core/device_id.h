// DeviceId: the global id of a device, shared by mesh/ (which devices a mesh names) and comm/
// (which devices a communicator spans).
#pragma once

namespace meshflow {

// The thread index under the `threads` backend, the MPI world rank under `mpi`.
using DeviceId = int;

}  // namespace meshflow
