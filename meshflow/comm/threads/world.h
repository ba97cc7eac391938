// The state shared by the device threads of one `threads` launch: the registry of groups, each
// group's rendezvous slots and point-to-point channels, and the failure and exit status of every
// device, so that no wait outlives a failed or finished peer.
//
// Rendezvous protocol. Every collective a rank issues on a group gets the group-local sequence
// number `seq` (ranks issue collectives in the same order, so numbers match). The slot for `seq`
// counts, per phase, which ranks have arrived. Phase 0 publishes each rank's options (its buffer
// pointers). A rank waits for a phase until all ranks arrived, a device failed, a missing rank's
// device exited, or the deadline passed.
//
// Shared work. Once every rank has published, every rank knows every rank's buffers, so the
// copies and reductions of a step form one list of pieces that any rank may run: ranks claim
// pieces from the slot's counter for that step until none is left, then wait until every piece
// of the step is done (finish), not until every rank has come: after the last step's finish no
// piece reads or writes any buffer, so each rank may return. With more device threads than
// cores, the ranks that are running do the work of those that are not, and neither waits for
// them to be scheduled again; a late rank finds its work done.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow::threads {

class World;

// One group of devices (a communicator's members, by rank).
class Group {
 public:
  Group(World& world, std::vector<DeviceId> devices)
      : world_(world), devices_(std::move(devices)) {}

  const std::vector<DeviceId>& devices() const { return devices_; }
  int size() const { return static_cast<int>(devices_.size()); }

  // Rank `rank` arrives at `phase` of collective `seq`, publishing `args` (phase 0 only; the
  // slot keeps them alive until every rank has left, so no peer ever reads freed options).
  // Returns every rank's published args once all ranks arrived. Throws Error(kCommunication)
  // when a device failed or a missing device exited, Error(kTimeout) after `timeout`; `what`
  // names the collective in messages.
  std::vector<const void*> arrive(std::uint64_t seq, int rank, int phase,
                                  std::shared_ptr<const void> args, Timeout timeout,
                                  const std::string& what);
  // Returns the index of the next unclaimed piece of step `step` of collective `seq` (0, 1,
  // ...; each index is returned once across all ranks). Valid between arrive and leave.
  std::int64_t claim(std::uint64_t seq, int step);
  // Counts the `done` pieces of step `step` this rank ran, then waits until all `total` pieces
  // of the step are done, by any rank. Throws as arrive does on failure or timeout.
  void finish(std::uint64_t seq, int step, std::int64_t done, std::int64_t total, Timeout timeout,
              const std::string& what);

  // Rank `rank` is done with collective `seq`, whether it succeeded or failed; the slot is freed
  // once every rank has left.
  void leave(std::uint64_t seq, int rank);

  // Point to point. A send and a recv with the same (source, destination, tag) match in issue
  // order; whichever arrives second copies and completes both events.
  void post_send(int src, int dst, int tag, const std::byte* data, std::int64_t bytes,
                 std::shared_ptr<EventState> done);
  void post_recv(int src, int dst, int tag, std::byte* data, std::int64_t bytes,
                 std::shared_ptr<EventState> done);

  // Fails every pending point-to-point event with `error` and wakes every waiter.
  void abort_pending(std::exception_ptr error);
  // Wakes every waiter and fails pending point-to-point events whose peer is `device`, which
  // finished its program and so will never match them.
  void on_exit(DeviceId device);

 private:
  struct Slot {
    std::vector<const void*> args;
    std::vector<std::shared_ptr<const void>> keep;          // owners of args
    std::vector<std::vector<char>> arrived;                 // [phase][rank]
    std::vector<int> count;                                 // ranks arrived per phase
    std::array<std::atomic<std::int64_t>, 4> next_piece{};  // shared work, per step
    std::array<std::atomic<std::int64_t>, 4> done_pieces{};
    int left = 0;
    // Set when a rank gave up on this collective (timeout, failure): its options may be gone,
    // so a late rank must fail rather than read them.
    std::optional<std::string> abandoned;
  };
  // A posted send (send_data set) or receive (recv_data set) waiting for its match.
  struct Pending {
    std::byte* recv_data;
    const std::byte* send_data;
    std::int64_t bytes;
    std::shared_ptr<EventState> done;
  };
  struct Channel {
    std::deque<Pending> sends;
    std::deque<Pending> recvs;
  };

  // Matches `mine` with the oldest opposite posting of (src, dst, tag), or queues it.
  void post(int src, int dst, int tag, Pending mine, bool sending);
  // Gives up on a collective (mu_ held): marks its slot abandoned with `message`, so that late
  // ranks fail rather than read options that may be gone, wakes every waiter and throws.
  [[noreturn]] void abandon(Slot& slot, ErrorKind kind, const std::string& message);

  World& world_;
  const std::vector<DeviceId> devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Slot> slots_;
  std::map<std::tuple<int, int, int>, Channel> channels_;
};

class World {
 public:
  // A world of the devices `devices` (distinct ids, in world rank order).
  World(std::vector<DeviceId> devices, Timeout timeout);

  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceId>& devices() const { return devices_; }
  // Returns the world rank of `device`, a member.
  int index_of(DeviceId device) const;
  Timeout timeout() const { return timeout_; }

  // Returns the group over `devices` (created once, shared by all members).
  std::shared_ptr<Group> group(const std::vector<DeviceId>& devices);

  // Records that `device` failed with `what` (the first failure is kept) and wakes every waiter.
  void mark_failed(DeviceId device, const std::string& what);
  // Records that `device` finished its program and wakes every waiter.
  void mark_exited(DeviceId device);

  // Returns the failure message if a device failed.
  std::optional<std::string> failure() const;
  // Returns the device that failed first, if any.
  std::optional<DeviceId> first_failed() const;
  bool exited(DeviceId device) const { return exited_[index_of(device)].load(); }

 private:
  void wake_all(std::exception_ptr error);

  const std::vector<DeviceId> devices_;
  std::map<DeviceId, int> index_;
  const Timeout timeout_;
  mutable std::mutex mu_;
  std::map<std::vector<DeviceId>, std::shared_ptr<Group>> groups_;
  std::atomic<bool> failed_{false};
  std::optional<DeviceId> failed_device_;
  std::string failure_;
  std::vector<std::atomic<bool>> exited_;
};

// Runs `body` as device `device`'s program; when it throws, marks the device failed in `world`
// (its peers' collectives then fail naming it) and returns the exception, else null.
std::exception_ptr run_device(World& world, DeviceId device, const std::function<void()>& body);

}  // namespace meshflow::threads
