// The blocking and asynchronous free functions over Communicator, and shared argument checks.
#include "meshflow/comm/communicator.h"

#include "meshflow/core/error.h"

namespace meshflow {

Timeout resolve_timeout(const Communicator& comm, Timeout requested) {
  return requested.count() > 0 ? requested : comm.default_timeout();
}

std::string describe(std::string_view collective, const std::vector<DeviceId>& devices) {
  std::string out = fmt::format("{} on devices [", collective);
  for (std::size_t i = 0; i < devices.size(); ++i)
    out += (i ? "," : "") + std::to_string(devices[i]);
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

}  // namespace meshflow
