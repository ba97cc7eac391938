// The recording communicator.
#include "meshflow/comm/recording.h"

#include <algorithm>
#include <numeric>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

std::string list(const std::vector<std::int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{0});
}

std::int64_t elements(const std::vector<Box>& boxes) {
  std::int64_t n = 0;
  for (const Box& b : boxes) n += numel(b);
  return n;
}

}  // namespace

std::string to_string(const RecordedCall& call) {
  std::string out = call.collective;
  if (call.op) out += fmt::format(" {}", to_string(*call.op));
  out += fmt::format(" {} group {} counts {} sent {} received {} bytes", to_string(call.dtype),
                     list({call.group.begin(), call.group.end()}), list(call.counts),
                     call.bytes_sent, call.bytes_received);
  return out;
}

RecordingCommunicator::RecordingCommunicator(std::vector<DeviceId> world, DeviceId device,
                                             std::shared_ptr<CallLog> log,
                                             std::shared_ptr<Communicator> inner)
    : world_(world), devices_(std::move(world)), log_(std::move(log)), inner_(std::move(inner)) {
  auto it = std::find(devices_.begin(), devices_.end(), device);
  MESHFLOW_CHECK(it != devices_.end(), "device {} is not in the recorded world", device);
  rank_ = static_cast<int>(it - devices_.begin());
}

template <typename Forward>
Event RecordingCommunicator::record(RecordedCall call, Forward forward) {
  call.group = devices_;
  log_->push_back(std::move(call));
  if (inner_) return forward(*inner_);
  return Event();
}

Event RecordingCommunicator::all_reduce(const AllReduceOptions& o, Completion c) {
  check_count(*this, "all_reduce", o.count);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  const std::int64_t others = size() - 1;
  return record({.collective = "all_reduce",
                 .dtype = o.dtype,
                 .op = o.op,
                 .counts = {o.count},
                 .bytes_sent = others * o.count * es / std::max(1, size()),
                 .bytes_received = others * o.count * es / std::max(1, size())},
                [&](Communicator& i) { return i.all_reduce(o, c); });
}

Event RecordingCommunicator::all_gather(const AllGatherOptions& o, Completion c) {
  check_counts(*this, "all_gather", "recv_counts", o.recv_counts);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  const std::int64_t mine = o.recv_counts[rank_];
  return record({.collective = "all_gather",
                 .dtype = o.dtype,
                 .counts = o.recv_counts,
                 .bytes_sent = (size() - 1) * mine * es,
                 .bytes_received = (sum(o.recv_counts) - mine) * es},
                [&](Communicator& i) { return i.all_gather(o, c); });
}

Event RecordingCommunicator::reduce_scatter(const ReduceScatterOptions& o, Completion c) {
  check_counts(*this, "reduce_scatter", "recv_counts", o.recv_counts);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  const std::int64_t mine = o.recv_counts[rank_];
  return record({.collective = "reduce_scatter",
                 .dtype = o.dtype,
                 .op = o.op,
                 .counts = o.recv_counts,
                 .bytes_sent = (sum(o.recv_counts) - mine) * es,
                 .bytes_received = (size() - 1) * mine * es},
                [&](Communicator& i) { return i.reduce_scatter(o, c); });
}

Event RecordingCommunicator::all_to_all(const AllToAllOptions& o, Completion c) {
  check_counts(*this, "all_to_all", "send_counts", o.send_counts);
  check_counts(*this, "all_to_all", "recv_counts", o.recv_counts);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  return record({.collective = "all_to_all",
                 .dtype = o.dtype,
                 .counts = o.recv_counts,
                 .bytes_sent = (sum(o.send_counts) - o.send_counts[rank_]) * es,
                 .bytes_received = (sum(o.recv_counts) - o.recv_counts[rank_]) * es},
                [&](Communicator& i) { return i.all_to_all(o, c); });
}

Event RecordingCommunicator::broadcast(const BroadcastOptions& o, Completion c) {
  check_rank(*this, "broadcast", "root", o.root);
  check_count(*this, "broadcast", o.count);
  const auto bytes = o.count * static_cast<std::int64_t>(size_of(o.dtype));
  const bool root = index(o.root) == rank_;
  return record({.collective = "broadcast",
                 .dtype = o.dtype,
                 .counts = {o.count},
                 .bytes_sent = root ? (size() - 1) * bytes : 0,
                 .bytes_received = root ? 0 : bytes},
                [&](Communicator& i) { return i.broadcast(o, c); });
}

Event RecordingCommunicator::send(const SendOptions& o, Completion c) {
  check_rank(*this, "send", "peer", o.peer);
  check_count(*this, "send", o.count);
  return record({.collective = "send",
                 .dtype = o.dtype,
                 .counts = {o.count},
                 .bytes_sent = o.count * static_cast<std::int64_t>(size_of(o.dtype))},
                [&](Communicator& i) { return i.send(o, c); });
}

Event RecordingCommunicator::recv(const RecvOptions& o, Completion c) {
  check_rank(*this, "recv", "peer", o.peer);
  check_count(*this, "recv", o.count);
  return record({.collective = "recv",
                 .dtype = o.dtype,
                 .counts = {o.count},
                 .bytes_received = o.count * static_cast<std::int64_t>(size_of(o.dtype))},
                [&](Communicator& i) { return i.recv(o, c); });
}

Event RecordingCommunicator::collective_permute(const PermuteOptions& o, Completion c) {
  check_count(*this, "collective_permute", o.send_count);
  check_count(*this, "collective_permute", o.recv_count);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  return record({.collective = "collective_permute",
                 .dtype = o.dtype,
                 .counts = {o.recv_count},
                 .bytes_sent = o.send_count * es,
                 .bytes_received = o.recv_count * es},
                [&](Communicator& i) { return i.collective_permute(o, c); });
}

Event RecordingCommunicator::barrier(const BarrierOptions& o, Completion c) {
  return record({.collective = "barrier"}, [&](Communicator& i) { return i.barrier(o, c); });
}

Event RecordingCommunicator::exchange_boxes(const ExchangeBoxesOptions& o, Completion c) {
  check_exchange(*this, o);
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  RecordedCall call{.collective = "exchange_boxes", .dtype = o.dtype};
  for (int k = 0; k < size(); ++k) {
    const std::int64_t in = elements(o.recv[k]);
    call.counts.push_back(in);
    if (k == rank_) continue;
    call.bytes_received += in * es;
    call.bytes_sent += elements(o.send[k]) * es;
  }
  return record(std::move(call), [&](Communicator& i) { return i.exchange_boxes(o, c); });
}

std::shared_ptr<Communicator> RecordingCommunicator::group(const std::vector<DeviceId>& members) {
  check_members(members, device(), world_);
  auto out = std::make_shared<RecordingCommunicator>(members, device(), log_,
                                                     inner_ ? inner_->group(members) : nullptr);
  out->world_ = world_;
  return out;
}

}  // namespace meshflow
