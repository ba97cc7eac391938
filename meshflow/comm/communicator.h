// Communicator: a group of devices that run collectives together. One options struct plus one
// free function per collective (and an _async form returning an Event); backends (threads/,
// mpi/) implement the narrow virtual interface below. comm/ knows nothing of meshes: groups are
// lists of global device ids.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/core/box.h"
#include "meshflow/core/device_id.h"
#include "meshflow/core/dtype.h"
#include "meshflow/core/event.h"
#include "meshflow/core/reduce_op.h"

namespace meshflow {

// A timeout of 0 means "the communicator's default" (LaunchOptions::timeout).
using Timeout = std::chrono::milliseconds;

// Returns `seconds` (a --timeout, a timeout= keyword) as a Timeout.
inline Timeout timeout_of_seconds(double seconds) {
  return std::chrono::duration_cast<Timeout>(std::chrono::duration<double>(seconds));
}

// A member's position in a communicator's group (0 .. size - 1). Distinct from DeviceId (a
// device's global label): rank_of converts one into the other.
enum class Rank : int {};

// Returns the rank as an index.
inline int index(Rank rank) { return static_cast<int>(rank); }

// Counts are in elements of `dtype`. Where a collective takes per-rank counts ("v" forms), the
// vectors have one entry per rank of the communicator and blocks lie back to back in rank
// order. A send buffer may equal the receive buffer where noted (in place).

// recv = op over ranks of send, count elements. send == recv allowed.
struct AllReduceOptions {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout{0};
};

// recv (sum of recv_counts elements) = every rank's send (recv_counts[rank] elements) in rank
// order. send may point at this rank's block of recv (in place).
struct AllGatherOptions {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::vector<std::int64_t> recv_counts;
  DType dtype = DType::kFloat32;
  Timeout timeout{0};
};

// recv (recv_counts[rank] elements) = op over ranks of block `rank` of send (which holds sum of
// recv_counts elements).
struct ReduceScatterOptions {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::vector<std::int64_t> recv_counts;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout{0};
};

// Block k of send (send_counts[k] elements) goes to rank k; block k of recv (recv_counts[k])
// comes from rank k. Every rank's send_counts[j] must equal rank j's recv_counts[this rank].
struct AllToAllOptions {
  const std::byte* send = nullptr;
  std::vector<std::int64_t> send_counts;
  std::byte* recv = nullptr;
  std::vector<std::int64_t> recv_counts;
  DType dtype = DType::kFloat32;
  Timeout timeout{0};
};

// data on every rank = data on `root` (a rank of this communicator).
struct BroadcastOptions {
  std::byte* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  Rank root{0};
  Timeout timeout{0};
};

// Point to point: `peer` is a rank of this communicator; sends and receives with the same
// (source, destination, tag) match in the order they are issued.
struct SendOptions {
  const std::byte* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  Rank peer{0};
  int tag = 0;
  Timeout timeout{0};
};
struct RecvOptions {
  std::byte* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  Rank peer{0};
  int tag = 0;
  Timeout timeout{0};
};

// Collective permute by `shift` k: rank r sends send (send_count) to rank (r - k) mod n and
// receives recv (recv_count) from rank (r + k) mod n.
struct PermuteOptions {
  const std::byte* send = nullptr;
  std::int64_t send_count = 0;
  std::byte* recv = nullptr;
  std::int64_t recv_count = 0;
  DType dtype = DType::kFloat32;
  int shift = 1;
  Timeout timeout{0};
};

struct BarrierOptions {
  Timeout timeout{0};
};

// Moves n-d regions between ranks in one step: the general data movement of redistribution.
// src and dst are row-major tensors of src_shape and dst_shape (not overlapping). send[k] lists
// regions of src for rank k; recv[k] lists the regions of dst filled from rank k, in the order
// rank k sends them (equal extents). Regions sent to this rank itself are copied locally. On
// shared memory each byte is copied once, from the sender's src straight into the receiver's dst.
struct ExchangeBoxesOptions {
  const std::byte* src = nullptr;
  Shape src_shape;
  std::byte* dst = nullptr;
  Shape dst_shape;
  DType dtype = DType::kFloat32;
  std::vector<std::vector<Box>> send;
  std::vector<std::vector<Box>> recv;
  Timeout timeout{0};
};

// Whether a call returns once the work is done (kWait: the returned event is complete) or as
// soon as it is started (kAsync).
enum class Completion { kWait, kAsync };

// Owns a backend's group handle. Collectives must be called by every rank of the group in the
// same order. Thread-compatible: one device's communicators are used from that device's thread.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string_view backend() const = 0;
  // This device's rank in the group, the group size, and the group's devices by rank.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::vector<DeviceId>& devices() const = 0;
  DeviceId device() const { return devices()[rank()]; }
  // The timeout a collective with Timeout{0} uses.
  virtual Timeout default_timeout() const = 0;
  // True when every rank's buffers are addressable from this device (threads: one address
  // space), so a rank may read a peer's buffer in place between two collectives that order the
  // accesses (runtime/overlap.h's in-place form).
  virtual bool shares_memory() const { return false; }

  virtual Event all_reduce(const AllReduceOptions& o, Completion c) = 0;
  virtual Event all_gather(const AllGatherOptions& o, Completion c) = 0;
  virtual Event reduce_scatter(const ReduceScatterOptions& o, Completion c) = 0;
  virtual Event all_to_all(const AllToAllOptions& o, Completion c) = 0;
  virtual Event broadcast(const BroadcastOptions& o, Completion c) = 0;
  virtual Event send(const SendOptions& o, Completion c) = 0;
  virtual Event recv(const RecvOptions& o, Completion c) = 0;
  virtual Event collective_permute(const PermuteOptions& o, Completion c) = 0;
  virtual Event barrier(const BarrierOptions& o, Completion c) = 0;
  virtual Event exchange_boxes(const ExchangeBoxesOptions& o, Completion c) = 0;

  // Returns the communicator over `devices` (global ids, in rank order), which must include this
  // device. Created on first use and cached; every member must ask for the group, in the same
  // order relative to its other collectives.
  virtual std::shared_ptr<Communicator> group(const std::vector<DeviceId>& devices) = 0;
};

// Blocking collectives: return when this rank's part is done; throw Error on failure or timeout.
void all_reduce(Communicator& comm, const AllReduceOptions& o);
void all_gather(Communicator& comm, const AllGatherOptions& o);
void reduce_scatter(Communicator& comm, const ReduceScatterOptions& o);
void all_to_all(Communicator& comm, const AllToAllOptions& o);
void broadcast(Communicator& comm, const BroadcastOptions& o);
void send(Communicator& comm, const SendOptions& o);
void recv(Communicator& comm, const RecvOptions& o);
void collective_permute(Communicator& comm, const PermuteOptions& o);
void barrier(Communicator& comm, const BarrierOptions& o = {});
void exchange_boxes(Communicator& comm, const ExchangeBoxesOptions& o);

// Asynchronous forms: return at once; the buffers must stay valid until the event completes.
Event all_reduce_async(Communicator& comm, const AllReduceOptions& o);
Event all_gather_async(Communicator& comm, const AllGatherOptions& o);
Event reduce_scatter_async(Communicator& comm, const ReduceScatterOptions& o);
Event all_to_all_async(Communicator& comm, const AllToAllOptions& o);
Event broadcast_async(Communicator& comm, const BroadcastOptions& o);
Event send_async(Communicator& comm, const SendOptions& o);
Event recv_async(Communicator& comm, const RecvOptions& o);
Event collective_permute_async(Communicator& comm, const PermuteOptions& o);
Event barrier_async(Communicator& comm, const BarrierOptions& o = {});
Event exchange_boxes_async(Communicator& comm, const ExchangeBoxesOptions& o);

// Returns the rank of `device` in `comm`; throws Error naming both when it is not a member.
Rank rank_of(const Communicator& comm, DeviceId device);

// Returns `text` as rank `root` holds it, on every rank (two broadcasts: length, then bytes).
std::string broadcast_string(Communicator& comm, std::string text, Rank root);

// Returns every rank's `text`, in rank order, on every rank (two all-gathers).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text);

// Returns the timeout `requested` resolves to on `comm` (its default when 0).
Timeout resolve_timeout(const Communicator& comm, Timeout requested);

// Returns "all_reduce on devices [0,1,2,3]" for messages.
std::string describe(std::string_view collective, const std::vector<DeviceId>& devices);

// Runs fn() on every device of `comm` after a barrier and returns the span from the first
// device's start to the last device's end, the same on every device (steady_clock is one clock
// for every thread, and for every process of one machine): how the benchmarks and calibrate time
// what all devices do at once.
double time_between_barriers(Communicator& comm, const std::function<void()>& fn);

// Returns the prefix sums of `counts` (displacements), with one extra final entry (the total).
std::vector<std::int64_t> displacements(const std::vector<std::int64_t>& counts);

// The argument checks every backend runs before a call starts, so both reject the same bad
// arguments with the same message (naming the collective, its devices and the value).
// check_exchange: one region list per rank in send and recv, each region inside its tensor.
// check_counts: one non-negative entry per rank. check_count: a non-negative element count.
// check_rank: a rank of this group (`role`: "root", "peer"); a peer must not be this rank.
// check_members: `members` (global ids, rank order) lists no device twice, includes `self`,
// and names only devices in `world`.
void check_exchange(const Communicator& comm, const ExchangeBoxesOptions& o);
void check_counts(const Communicator& comm, std::string_view collective, std::string_view field,
                  const std::vector<std::int64_t>& counts);
void check_count(const Communicator& comm, std::string_view collective, std::int64_t count);
void check_rank(const Communicator& comm, std::string_view collective, std::string_view role,
                Rank rank);
void check_members(const std::vector<DeviceId>& members, DeviceId self,
                   const std::vector<DeviceId>& world);

}  // namespace meshflow
