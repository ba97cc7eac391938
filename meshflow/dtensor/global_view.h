// The global view of distributed tensors: one program for every device (as in JAX), the form the
// Python module offers. A GlobalTensor holds the shards of the devices this process drives —
// every device of its mesh on threads, this process's own under mpi — and each function runs the
// per-device DTensor API (dtensor.h) on those devices through a Session, so the results are the
// eager API's, shard for shard.
#pragma once

#include <map>
#include <vector>

#include "meshflow/comm/session.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"

namespace meshflow {

// Invariant: shards holds exactly the devices of layout.mesh the session drives, each with
// local_shape(layout, device).
//
// On threads, work that moves no data between devices (distributing, assembling, an operator
// whose strategy reads every operand where it lies) runs on the calling thread, every device's
// part in turn, when that is sooner than handing it to the device threads: as the cost model
// estimates it (kernel_seconds against MachineModel::device_handoff_us), and for an operator on
// layouts it has run on before, as those calls measured it. Results are the same either way.
struct GlobalTensor {
  Layout layout;
  std::map<DeviceId, Tensor> shards;
};

// Returns `global` (which every process passes identically, and which is read in place) laid out
// as `placements` on `mesh`; no communication. Partial placements are refused, as DTensor's
// distribute_tensor refuses them.
GlobalTensor distribute(Session& session, TensorView global, const DeviceMesh& mesh,
                        std::vector<Placement> placements);

// Returns the global tensor. threads: assembled here from the shards (Partial terms reduced; one
// replica of each box is read, as the global view keeps replicas equal). mpi: collective over
// the mesh; every process of the mesh gets it, and a process outside the mesh is refused.
Tensor full_tensor(Session& session, const GlobalTensor& t);

// Returns t laid out as `placements` on `mesh` (t's own mesh or another: a cross-mesh move runs
// on the devices of both), with the eager API's rules for Partial targets.
GlobalTensor redistribute(Session& session, const GlobalTensor& t, const DeviceMesh& mesh,
                          std::vector<Placement> placements);

// Applies `op` to operands on one mesh (the eager API's apply_op on every device).
GlobalTensor apply_op(Session& session, const Op& op,
                      const std::vector<const GlobalTensor*>& operands);

// Returns a Replicate tensor of shape [] holding `value` in `dtype` on `mesh` (a Python scalar
// operand).
GlobalTensor scalar(Session& session, double value, DType dtype, const DeviceMesh& mesh);

}  // namespace meshflow
