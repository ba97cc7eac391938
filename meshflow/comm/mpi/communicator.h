// The `mpi` backend's Communicator: each process is one device (device id = MPI world rank).
// Collectives map onto MPI's own; asynchronous forms use MPI's non-blocking calls and complete
// when the waiting thread's MPI_Testall says so.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/mpi/watchdog.h"

namespace meshflow::mpi {

// Fails with a communication error naming `what` and MPI's own text for `rc`, unless rc is
// MPI_SUCCESS (meshflow's communicators return MPI's errors rather than abort).
void check(int rc, std::string_view what);

// What this process owns across its communicators: the devices of the launch, the default
// timeout, the watchdog that bounds every blocking call, and the group cache.
struct ProcessContext {
  std::vector<DeviceId> devices;
  Timeout timeout;
  Watchdog* watchdog = nullptr;
  std::map<std::vector<DeviceId>, std::shared_ptr<Communicator>> groups;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; `context` must outlive this communicator.
  MpiCommunicator(ProcessContext* context, MPI_Comm comm, std::vector<DeviceId> devices);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string_view backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceId>& devices() const override { return devices_; }
  Timeout default_timeout() const override { return context_->timeout; }

  Event all_reduce(const AllReduceOptions& o, Completion c) override;
  Event all_gather(const AllGatherOptions& o, Completion c) override;
  Event reduce_scatter(const ReduceScatterOptions& o, Completion c) override;
  Event all_to_all(const AllToAllOptions& o, Completion c) override;
  Event broadcast(const BroadcastOptions& o, Completion c) override;
  Event send(const SendOptions& o, Completion c) override;
  Event recv(const RecvOptions& o, Completion c) override;
  Event collective_permute(const PermuteOptions& o, Completion c) override;
  Event barrier(const BarrierOptions& o, Completion c) override;
  Event exchange_boxes(const ExchangeBoxesOptions& o, Completion c) override;
  std::shared_ptr<Communicator> group(const std::vector<DeviceId>& devices) override;

  MPI_Comm handle() const { return comm_; }

 private:
  // Returns the watchdog guard for a blocking call described by `what` with `timeout`.
  Watchdog::Armed guard(const std::string& what, Timeout timeout) const {
    return Watchdog::Armed(*context_->watchdog, what, resolve_timeout(*this, timeout));
  }

  ProcessContext* context_;
  MPI_Comm comm_;      // collectives and user point-to-point
  MPI_Comm internal_;  // collective_permute, so its messages never match user receives
  std::vector<DeviceId> devices_;
  int rank_ = 0;
};

// Returns the communicator over `members` (world ranks, in rank order), cached in `context`;
// collective over those ranks only.
std::shared_ptr<Communicator> make_communicator(ProcessContext& context,
                                                const std::vector<DeviceId>& members);

// Returns the communicator over context.devices (world ranks, in that order); collective over
// those ranks only.
std::shared_ptr<Communicator> make_world_communicator(ProcessContext& context);

}  // namespace meshflow::mpi
