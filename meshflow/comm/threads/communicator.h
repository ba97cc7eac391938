// The `threads` backend's Communicator: devices are threads of one process and exchange data
// through shared memory, each byte copied once, straight into its destination. Collectives run
// on a per-device worker thread in issue order, so every call can be asynchronous.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/threads/world.h"

namespace meshflow::threads {

// Runs one device's collectives in issue order on its own thread.
class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  void post(std::function<void()> task);
  // Returns true when no task is queued or running, so the device's thread may run one itself
  // without reordering its collectives.
  bool idle();
  // Runs every posted task, then stops the thread.
  void drain();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// What one device owns: its worker and its cache of group communicators.
struct DeviceContext {
  DeviceContext(World& w, DeviceId d) : world(w), device(d) {}
  World& world;
  const DeviceId device;
  Worker worker;
  std::map<std::vector<DeviceId>, std::shared_ptr<Communicator>> groups;
};

class ThreadsCommunicator final : public Communicator {
 public:
  // `context` must outlive this communicator (it owns it through its group cache).
  ThreadsCommunicator(DeviceContext* context, std::shared_ptr<Group> group, int rank);

  std::string_view backend() const override { return "threads"; }
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::vector<DeviceId>& devices() const override { return group_->devices(); }
  Timeout default_timeout() const override { return context_->world.timeout(); }
  bool shares_memory() const override { return true; }

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

 private:
  // Posts `body(seq, options, timeout, what)` to the worker and returns its event (complete, or
  // thrown, for Completion::kWait). `Options` is copied so peers can
  // read it until every rank has left the collective.
  template <typename Options, typename Body>
  Event start(std::string_view name, const Options& o, Completion c, Body body);

  DeviceContext* context_;
  std::shared_ptr<Group> group_;
  const int rank_;
  std::uint64_t next_seq_ = 0;
};

// Returns the communicator over all of `context`'s world, for its device.
std::shared_ptr<Communicator> world_communicator(DeviceContext& context);

}  // namespace meshflow::threads
