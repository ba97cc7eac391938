// The blocking and asynchronous free functions over Communicator, and shared argument checks.
#include "meshflow/comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow {

Timeout resolve_timeout(const Communicator& comm, Timeout requested) {
  return requested.count() > 0 ? requested : comm.default_timeout();
}

std::string describe(std::string_view collective, const std::vector<DeviceId>& devices) {
  // Long groups are cut so that a message stays one readable line.
  constexpr std::size_t kShown = 8;
  std::string out = fmt::format("{} on devices [", collective);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices.size() > 2 * kShown && i == kShown) {
      out += fmt::format(",... ({} devices)", devices.size());
      break;
    }
    out += (i ? "," : "") + std::to_string(devices[i]);
  }
  return out + "]";
}

std::vector<std::int64_t> displacements(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> d(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
  return d;
}

void check_counts(const Communicator& comm, std::string_view collective, std::string_view field,
                  const std::vector<std::int64_t>& counts) {
  if (static_cast<int>(counts.size()) != comm.size()) {
    fail(ErrorKind::kInvalidArgument, "{}: {} has {} entries but the group has {} ranks",
         describe(collective, comm.devices()), field, counts.size(), comm.size());
  }
  for (std::int64_t c : counts) {
    if (c < 0)
      fail(ErrorKind::kInvalidArgument, "{}: {} has a negative count {}",
           describe(collective, comm.devices()), field, c);
  }
}

Rank rank_of(const Communicator& comm, DeviceId device) {
  const auto& ds = comm.devices();
  for (std::size_t i = 0; i < ds.size(); ++i) {
    if (ds[i] == device) return Rank{static_cast<int>(i)};
  }
  fail(ErrorKind::kInvalidArgument, "device {} is not a member of {}", device,
       describe("the group", ds));
}

std::string broadcast_string(Communicator& comm, std::string text, Rank root) {
  std::int64_t length = static_cast<std::int64_t>(text.size());
  broadcast(comm, {.data = reinterpret_cast<std::byte*>(&length),
                   .count = 1,
                   .dtype = DType::kInt64,
                   .root = root});
  // The bytes travel as int64 words; the buffer is padded to a whole word.
  std::vector<std::int64_t> words(static_cast<std::size_t>((length + 7) / 8), 0);
  if (comm.rank() == index(root) && !text.empty())
    std::memcpy(words.data(), text.data(), text.size());
  broadcast(comm, {.data = reinterpret_cast<std::byte*>(words.data()),
                   .count = static_cast<std::int64_t>(words.size()),
                   .dtype = DType::kInt64,
                   .root = root});
  text.assign(reinterpret_cast<const char*>(words.data()), static_cast<std::size_t>(length));
  return text;
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text) {
  const auto n = static_cast<std::size_t>(comm.size());
  // The bytes travel as int64 words, each rank's padded to a whole word.
  std::vector<std::int64_t> lengths(n);
  const auto length = static_cast<std::int64_t>(text.size());
  all_gather(comm, {.send = reinterpret_cast<const std::byte*>(&length),
                    .recv = reinterpret_cast<std::byte*>(lengths.data()),
                    .recv_counts = std::vector<std::int64_t>(n, 1),
                    .dtype = DType::kInt64});
  std::vector<std::int64_t> counts(n);
  std::int64_t total = 0;
  for (std::size_t r = 0; r < n; ++r) total += counts[r] = (lengths[r] + 7) / 8;
  std::vector<std::int64_t> mine(static_cast<std::size_t>((length + 7) / 8), 0);
  if (!text.empty()) std::memcpy(mine.data(), text.data(), text.size());
  std::vector<std::int64_t> all(static_cast<std::size_t>(total));
  all_gather(comm, {.send = reinterpret_cast<const std::byte*>(mine.data()),
                    .recv = reinterpret_cast<std::byte*>(all.data()),
                    .recv_counts = counts,
                    .dtype = DType::kInt64});
  std::vector<std::string> out;
  std::int64_t at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all.data() + at),
                     static_cast<std::size_t>(lengths[r]));
    at += counts[r];
  }
  return out;
}

void check_count(const Communicator& comm, std::string_view collective, std::int64_t count) {
  if (count < 0) {
    fail(ErrorKind::kInvalidArgument, "{}: negative count {}", describe(collective, comm.devices()),
         count);
  }
}

void check_rank(const Communicator& comm, std::string_view collective, std::string_view role,
                Rank rank) {
  const bool peer = role == "peer";
  if (index(rank) < 0 || index(rank) >= comm.size() || (peer && index(rank) == comm.rank())) {
    fail(ErrorKind::kInvalidArgument, "{}: {} rank {} is {} (the group has ranks 0..{}{})",
         describe(collective, comm.devices()), role, index(rank),
         peer && index(rank) == comm.rank() ? "this rank" : "out of range", comm.size() - 1,
         peer ? fmt::format(", this is rank {}", comm.rank()) : "");
  }
}

void check_members(const std::vector<DeviceId>& members, DeviceId self,
                   const std::vector<DeviceId>& world) {
  std::vector<DeviceId> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    fail(ErrorKind::kInvalidArgument, "{}: a device is listed twice", describe("group", members));
  }
  if (std::find(members.begin(), members.end(), self) == members.end()) {
    fail(ErrorKind::kInvalidArgument, "{}: device {} is not a member", describe("group", members),
         self);
  }
  std::vector<DeviceId> known = world;
  std::sort(known.begin(), known.end());
  for (DeviceId d : members) {
    if (!std::binary_search(known.begin(), known.end(), d)) {
      fail(ErrorKind::kInvalidArgument, "group names device {}, which this launch does not run", d);
    }
  }
}

void check_exchange(const Communicator& comm, const ExchangeBoxesOptions& o) {
  const std::string what = describe("exchange_boxes", comm.devices());
  if (static_cast<int>(o.send.size()) != comm.size() ||
      static_cast<int>(o.recv.size()) != comm.size()) {
    fail(ErrorKind::kInvalidArgument,
         "{}: send and recv need one region list per rank ({}), got {} and {}", what, comm.size(),
         o.send.size(), o.recv.size());
  }
  auto inside = [&](const Box& b, const Shape& shape, const char* which) {
    if (!contains(full_box(shape), b) || b.offset.size() != shape.size()) {
      fail(ErrorKind::kInvalidArgument, "{}: {} region {} lies outside shape {}", what, which,
           to_string(b), to_string(shape));
    }
  };
  for (int k = 0; k < comm.size(); ++k) {
    for (const Box& b : o.send[k]) inside(b, o.src_shape, "send");
    for (const Box& b : o.recv[k]) inside(b, o.dst_shape, "recv");
  }
}

#define MESHFLOW_COLLECTIVE(name, Options)                                  \
  void name(Communicator& comm, const Options& o) {                         \
    comm.name(o, Completion::kWait).wait(resolve_timeout(comm, o.timeout)); \
  }                                                                         \
  Event name##_async(Communicator& comm, const Options& o) {                \
    return comm.name(o, Completion::kAsync);                                \
  }

MESHFLOW_COLLECTIVE(all_reduce, AllReduceOptions)
MESHFLOW_COLLECTIVE(all_gather, AllGatherOptions)
MESHFLOW_COLLECTIVE(reduce_scatter, ReduceScatterOptions)
MESHFLOW_COLLECTIVE(all_to_all, AllToAllOptions)
MESHFLOW_COLLECTIVE(broadcast, BroadcastOptions)
MESHFLOW_COLLECTIVE(send, SendOptions)
MESHFLOW_COLLECTIVE(recv, RecvOptions)
MESHFLOW_COLLECTIVE(collective_permute, PermuteOptions)
MESHFLOW_COLLECTIVE(barrier, BarrierOptions)
MESHFLOW_COLLECTIVE(exchange_boxes, ExchangeBoxesOptions)

#undef MESHFLOW_COLLECTIVE

double time_between_barriers(Communicator& comm, const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  barrier(comm);
  const double start = seconds(Clock::now());
  fn();
  const double end = seconds(Clock::now());
  // The span from the first device's start to the last device's end (steady_clock is one clock
  // for every thread, and for every process of one machine).
  const double mine[2] = {start, end};
  std::vector<double> all(2 * static_cast<std::size_t>(comm.size()));
  all_gather(comm, {.send = reinterpret_cast<const std::byte*>(mine),
                    .recv = reinterpret_cast<std::byte*>(all.data()),
                    .recv_counts = std::vector<std::int64_t>(comm.size(), 2),
                    .dtype = DType::kFloat64});
  double first = all[0], last = all[1];
  for (int r = 1; r < comm.size(); ++r) {
    first = std::min(first, all[2 * r]);
    last = std::max(last, all[2 * r + 1]);
  }
  return last - first;
}

}  // namespace meshflow
