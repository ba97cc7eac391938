// A recording fake Communicator: every call is appended to a log (its collective, group, dtype,
// op and sizes), so tests can assert exactly what communication a plan, an operator or a graph
// makes instead of inferring it from timings. Alone it moves no data (outputs are left as they
// are); wrapped around a real communicator it records and forwards, counting a real run.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"

namespace meshflow {

// One call as the calling device made it.
struct RecordedCall {
  std::string collective;  // "all_gather", "all_reduce", ..., "exchange_boxes", "barrier"
  std::vector<DeviceId> group;
  DType dtype = DType::kFloat32;
  std::optional<ReduceOp> op;        // reducing collectives
  std::vector<std::int64_t> counts;  // elements: per rank for v-forms and exchange_boxes (what
                                     // this device receives from each rank), else {count}
  std::int64_t bytes_sent = 0;       // by this device to other ranks
  std::int64_t bytes_received = 0;   // by this device from other ranks
  bool operator==(const RecordedCall&) const = default;
};

// Returns "all_gather float32 group [0,1,2,3] counts [20,20,20,5] sent 80 received 240 bytes".
std::string to_string(const RecordedCall& call);

using CallLog = std::vector<RecordedCall>;

class RecordingCommunicator final : public Communicator {
 public:
  // Acts as `device` in a world of `world` devices (rank order), appending to `log`. With
  // `inner` (a communicator over the same devices), each call is also forwarded to it.
  RecordingCommunicator(std::vector<DeviceId> world, DeviceId device, std::shared_ptr<CallLog> log,
                        std::shared_ptr<Communicator> inner = nullptr);

  std::string_view backend() const override { return "recording"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceId>& devices() const override { return devices_; }
  Timeout default_timeout() const override { return kTimeout; }
  // As the communicator it forwards to shares memory; false alone (it moves no data).
  bool shares_memory() const override { return inner_ && inner_->shares_memory(); }

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

  const CallLog& log() const { return *log_; }

 private:
  static constexpr Timeout kTimeout{std::chrono::seconds(60)};
  // Appends `call` (group and dtype filled in) and returns the event of the forwarded call, or a
  // complete event.
  template <typename Forward>
  Event record(RecordedCall call, Forward forward);

  std::vector<DeviceId> world_;    // every device the recorded launch runs
  std::vector<DeviceId> devices_;  // this communicator's group, rank order
  int rank_ = 0;
  std::shared_ptr<CallLog> log_;
  std::shared_ptr<Communicator> inner_;
};

}  // namespace meshflow
