// Runs one device's lowered plan (plan/lower.h) over a Communicator. The program says every
// group, count, region, reduction and scaling; the executor only makes those calls, so running
// a plan touches runtime/, comm/ and core/ alone. Uneven shards use the v-collectives or region
// exchanges the program names, so no data is padded, lost or invented.
#pragma once

#include "meshflow/comm/communicator.h"
#include "meshflow/core/tensor.h"
#include "meshflow/plan/lower.h"
#include "meshflow/plan/plan_cache.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

// Returns this device's shard after `program`, given its shard `local` before. `world` must
// hold every device of the program's groups (rank order need not match). Every device of both
// meshes must call with its own program. `recycled`, when its dtype and shape match the result,
// becomes the result's storage (so a loop that redistributes every step reuses one buffer
// instead of allocating and faulting in a fresh one). Throws Error naming the device when
// `local` is not the shard the program expects.
Tensor execute(const DeviceProgram& program, Communicator& world, const Tensor& local,
               Tensor recycled = Tensor());

// A move on its way: `out` holds its result once `done` has completed.
struct StartedMove {
  Tensor out;
  Event done;
};

// Starts `program` and returns at once when it is one gather (an all-gather or a region
// exchange, unscaled): its collective is issued now, in order with this device's other
// collectives, and runs while the caller goes on (ZeRO-3's prefetched weight gathers). `local`
// must stay alive and unchanged until `done`. Any other program runs as execute runs it, and
// `done` is complete.
StartedMove start(const DeviceProgram& program, Communicator& world, const Tensor& local);

// A program of one point-to-point step between devices of disjoint meshes (pipeline stages),
// run as two halves matched by `tag` instead of one exchange every device joins in order.
// send_tagged posts this device's regions (packed, one message per receiving device) and
// returns at once: each posted message's buffer and event, to be kept until the event
// completes. receive_tagged waits for this device's regions and returns its shard (terms
// reduced and scaled as execute does). Every message of a tag between two devices is one call.
std::vector<std::pair<Tensor, Event>> send_tagged(const DeviceProgram& program, Communicator& world,
                                                  const Tensor& local, int tag);
Tensor receive_tagged(const DeviceProgram& program, Communicator& world, int tag);

}  // namespace meshflow
