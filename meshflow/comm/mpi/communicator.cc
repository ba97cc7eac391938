// MPI collectives behind the Communicator interface. A blocking call is the blocking MPI call
// itself (so it costs what MPI costs); an asynchronous call starts the MPI_I* form and returns
// an event whose wait polls MPI_Testall. avg is MPI_SUM followed by a local division, the same on
// every rank, so all ranks keep identical bits.
#include "meshflow/comm/mpi/communicator.h"

#include <algorithm>
#include <climits>

#include "meshflow/core/error.h"

namespace meshflow::mpi {

namespace {

void check(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ErrorKind::kCommunication, "{} failed: {}", what, std::string(text, len));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int as_int(std::int64_t count, std::string_view what) {
  if (count < 0 || count > INT_MAX)
    fail(ErrorKind::kInvalidArgument, "{}: count {} is outside MPI's int range", what, count);
  return static_cast<int>(count);
}

std::vector<int> as_ints(const std::vector<std::int64_t>& v, std::string_view what) {
  std::vector<int> out;
  for (std::int64_t x : v) out.push_back(as_int(x, what));
  return out;
}

std::vector<int> int_displacements(const std::vector<int>& counts, std::string_view what) {
  std::vector<int> d(counts.size(), 0);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    d[i] = as_int(total, what);
    total += counts[i];
  }
  as_int(total, what);
  return d;
}

// Returns the event for work started with `requests` (a blocking call passes none). `finish`
// runs once when the requests complete (e.g. the avg division). Vectors the MPI call reads
// (counts, displacements) are kept alive in `keep` until then.
Event finish_event(std::string what, std::vector<MPI_Request> requests,
                   std::function<void()> finish, std::shared_ptr<void> keep = nullptr) {
  if (requests.empty()) {
    if (finish) finish();
    return Event();
  }
  auto state = std::make_shared<EventState>(what);
  auto reqs = std::make_shared<std::vector<MPI_Request>>(std::move(requests));
  state->set_poll([reqs, finish, keep, what] {
    int done = 0;
    check(MPI_Testall(static_cast<int>(reqs->size()), reqs->data(), &done, MPI_STATUSES_IGNORE),
          what);
    if (done && finish) finish();
    return done != 0;
  });
  return Event(state);
}

std::function<void()> avg_finish(ReduceOp op, DType dtype, std::byte* data, std::int64_t count,
                                 int n) {
  if (op != ReduceOp::kAvg) return nullptr;
  return [=] { divide_by(dtype, data, count, n); };
}

}  // namespace

MpiCommunicator::MpiCommunicator(ProcessContext* context, MPI_Comm comm,
                                 std::vector<DeviceId> devices)
    : context_(context), comm_(comm), devices_(std::move(devices)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  check(MPI_Comm_dup(comm_, &internal_), "MPI_Comm_dup");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm_free(&internal_);
  if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
}

Event MpiCommunicator::all_reduce(const AllReduceOptions& o, Completion c) {
  const std::string what = describe("all_reduce", devices_);
  check_count(*this, "all_reduce", o.count);
  const int count = as_int(o.count, what);
  const void* send = o.send == o.recv ? MPI_IN_PLACE : static_cast<const void*>(o.send);
  auto finish = avg_finish(o.op, o.dtype, o.recv, o.count, size());
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Allreduce(send, o.recv, count, mpi_type(o.dtype), mpi_op(o.op), comm_), what);
    return finish_event(what, {}, finish);
  }
  MPI_Request req;
  check(MPI_Iallreduce(send, o.recv, count, mpi_type(o.dtype), mpi_op(o.op), comm_, &req), what);
  return finish_event(what, {req}, finish);
}

Event MpiCommunicator::all_gather(const AllGatherOptions& o, Completion c) {
  const std::string what = describe("all_gather", devices_);
  check_counts(*this, "all_gather", "recv_counts", o.recv_counts);
  auto counts = std::make_shared<std::vector<int>>(as_ints(o.recv_counts, what));
  auto displs = std::make_shared<std::vector<int>>(int_displacements(*counts, what));
  const std::size_t es = size_of(o.dtype);
  const std::byte* mine = o.recv + static_cast<std::size_t>((*displs)[rank_]) * es;
  const void* send = o.send == mine ? MPI_IN_PLACE : static_cast<const void*>(o.send);
  const MPI_Datatype t = mpi_type(o.dtype);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(
        MPI_Allgatherv(send, (*counts)[rank_], t, o.recv, counts->data(), displs->data(), t, comm_),
        what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Iallgatherv(send, (*counts)[rank_], t, o.recv, counts->data(), displs->data(), t, comm_,
                        &req),
        what);
  return finish_event(
      what, {req}, nullptr,
      std::make_shared<std::pair<decltype(counts), decltype(displs)>>(counts, displs));
}

Event MpiCommunicator::reduce_scatter(const ReduceScatterOptions& o, Completion c) {
  const std::string what = describe("reduce_scatter", devices_);
  check_counts(*this, "reduce_scatter", "recv_counts", o.recv_counts);
  auto counts = std::make_shared<std::vector<int>>(as_ints(o.recv_counts, what));
  int_displacements(*counts, what);  // the total must fit too
  auto finish = avg_finish(o.op, o.dtype, o.recv, o.recv_counts[rank_], size());
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(
        MPI_Reduce_scatter(o.send, o.recv, counts->data(), mpi_type(o.dtype), mpi_op(o.op), comm_),
        what);
    return finish_event(what, {}, finish);
  }
  MPI_Request req;
  check(MPI_Ireduce_scatter(o.send, o.recv, counts->data(), mpi_type(o.dtype), mpi_op(o.op), comm_,
                            &req),
        what);
  return finish_event(what, {req}, finish, counts);
}

Event MpiCommunicator::all_to_all(const AllToAllOptions& o, Completion c) {
  const std::string what = describe("all_to_all", devices_);
  check_counts(*this, "all_to_all", "send_counts", o.send_counts);
  check_counts(*this, "all_to_all", "recv_counts", o.recv_counts);
  struct Args {
    std::vector<int> sc, sd, rc, rd;
  };
  auto a = std::make_shared<Args>();
  a->sc = as_ints(o.send_counts, what);
  a->sd = int_displacements(a->sc, what);
  a->rc = as_ints(o.recv_counts, what);
  a->rd = int_displacements(a->rc, what);
  const MPI_Datatype t = mpi_type(o.dtype);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Alltoallv(o.send, a->sc.data(), a->sd.data(), t, o.recv, a->rc.data(), a->rd.data(),
                        t, comm_),
          what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Ialltoallv(o.send, a->sc.data(), a->sd.data(), t, o.recv, a->rc.data(), a->rd.data(), t,
                       comm_, &req),
        what);
  return finish_event(what, {req}, nullptr, a);
}

Event MpiCommunicator::broadcast(const BroadcastOptions& o, Completion c) {
  const std::string what = describe("broadcast", devices_);
  check_rank(*this, "broadcast", "root", o.root);
  check_count(*this, "broadcast", o.count);
  const int count = as_int(o.count, what);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Bcast(o.data, count, mpi_type(o.dtype), index(o.root), comm_), what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Ibcast(o.data, count, mpi_type(o.dtype), index(o.root), comm_, &req), what);
  return finish_event(what, {req}, nullptr);
}

Event MpiCommunicator::send(const SendOptions& o, Completion c) {
  check_rank(*this, "send", "peer", o.peer);
  check_count(*this, "send", o.count);
  const std::string what = fmt::format("send from device {} to device {} tag {}", device(),
                                       devices_[index(o.peer)], o.tag);
  const int count = as_int(o.count, what);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Send(o.data, count, mpi_type(o.dtype), index(o.peer), o.tag, comm_), what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Isend(o.data, count, mpi_type(o.dtype), index(o.peer), o.tag, comm_, &req), what);
  return finish_event(what, {req}, nullptr);
}

Event MpiCommunicator::recv(const RecvOptions& o, Completion c) {
  check_rank(*this, "recv", "peer", o.peer);
  check_count(*this, "recv", o.count);
  const std::string what = fmt::format("recv on device {} from device {} tag {}", device(),
                                       devices_[index(o.peer)], o.tag);
  const int count = as_int(o.count, what);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(
        MPI_Recv(o.data, count, mpi_type(o.dtype), index(o.peer), o.tag, comm_, MPI_STATUS_IGNORE),
        what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Irecv(o.data, count, mpi_type(o.dtype), index(o.peer), o.tag, comm_, &req), what);
  return finish_event(what, {req}, nullptr);
}

Event MpiCommunicator::collective_permute(const PermuteOptions& o, Completion c) {
  const std::string what = describe("collective_permute", devices_);
  check_count(*this, "collective_permute", o.send_count);
  check_count(*this, "collective_permute", o.recv_count);
  const int n = size();
  const int to = ((rank_ - o.shift) % n + n) % n;
  const int from = ((rank_ + o.shift) % n + n) % n;
  const int sc = as_int(o.send_count, what), rc = as_int(o.recv_count, what);
  const MPI_Datatype t = mpi_type(o.dtype);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Sendrecv(o.send, sc, t, to, 0, o.recv, rc, t, from, 0, internal_, MPI_STATUS_IGNORE),
          what);
    return Event();
  }
  MPI_Request reqs[2];
  check(MPI_Irecv(o.recv, rc, t, from, 0, internal_, &reqs[0]), what);
  check(MPI_Isend(o.send, sc, t, to, 0, internal_, &reqs[1]), what);
  return finish_event(what, {reqs[0], reqs[1]}, nullptr);
}

Event MpiCommunicator::barrier(const BarrierOptions& o, Completion c) {
  const std::string what = describe("barrier", devices_);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Barrier(comm_), what);
    return Event();
  }
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), what);
  return finish_event(what, {req}, nullptr);
}

Event MpiCommunicator::exchange_boxes(const ExchangeBoxesOptions& o, Completion c) {
  // Packs every outgoing region into one buffer in rank order, exchanges with MPI_Alltoallv and
  // unpacks into dst.
  const std::string what = describe("exchange_boxes", devices_);
  check_exchange(*this, o);
  const int n = size();
  struct State {
    std::vector<int> sc, sd, rc, rd;
    std::vector<std::byte> sendbuf, recvbuf;
  };
  auto st = std::make_shared<State>();
  const std::size_t es = size_of(o.dtype);
  auto total = [](const std::vector<Box>& boxes) {
    std::int64_t t = 0;
    for (const Box& b : boxes) t += numel(b);
    return t;
  };
  std::vector<std::int64_t> scount(n), rcount(n);
  for (int k = 0; k < n; ++k) {
    scount[k] = total(o.send[k]);
    rcount[k] = total(o.recv[k]);
  }
  st->sc = as_ints(scount, what);
  st->sd = int_displacements(st->sc, what);
  st->rc = as_ints(rcount, what);
  st->rd = int_displacements(st->rc, what);
  st->sendbuf.resize(static_cast<std::size_t>(displacements(scount)[n]) * es + 1);
  st->recvbuf.resize(static_cast<std::size_t>(displacements(rcount)[n]) * es + 1);
  std::int64_t at = 0;
  for (int k = 0; k < n; ++k) {
    for (const Box& b : o.send[k]) {
      Shape ext = b.extent;
      // Pack as a row-major block of shape b.extent at element `at`.
      copy_box(ConstBuffer{o.src, &o.src_shape, es}, b.offset,
               MutableBuffer{st->sendbuf.data() + at * es, &ext, es},
               std::vector<std::int64_t>(ext.size(), 0), b.extent);
      at += numel(b);
    }
  }
  auto unpack = [st, o, es, n] {
    std::int64_t pos = 0;
    for (int k = 0; k < n; ++k) {
      for (const Box& b : o.recv[k]) {
        Shape ext = b.extent;
        copy_box(ConstBuffer{st->recvbuf.data() + pos * es, &ext, es},
                 std::vector<std::int64_t>(ext.size(), 0), MutableBuffer{o.dst, &o.dst_shape, es},
                 b.offset, b.extent);
        pos += numel(b);
      }
    }
  };
  const MPI_Datatype t = mpi_type(o.dtype);
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Alltoallv(st->sendbuf.data(), st->sc.data(), st->sd.data(), t, st->recvbuf.data(),
                        st->rc.data(), st->rd.data(), t, comm_),
          what);
    unpack();
    return Event();
  }
  MPI_Request req;
  check(MPI_Ialltoallv(st->sendbuf.data(), st->sc.data(), st->sd.data(), t, st->recvbuf.data(),
                       st->rc.data(), st->rd.data(), t, comm_, &req),
        what);
  return finish_event(what, {req}, unpack, st);
}

std::shared_ptr<Communicator> MpiCommunicator::group(const std::vector<DeviceId>& members) {
  auto it = context_->groups.find(members);
  if (it != context_->groups.end()) return it->second;
  check_members(members, device(), context_->devices);
  return make_communicator(*context_, members);
}

std::shared_ptr<Communicator> make_communicator(ProcessContext& context,
                                                const std::vector<DeviceId>& members) {
  MPI_Group world_group, g;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &g);
  MPI_Comm comm;
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, /*tag=*/0, &comm);
  MPI_Group_free(&g);
  MPI_Group_free(&world_group);
  check(rc, describe("group", members));
  auto out = std::make_shared<MpiCommunicator>(&context, comm, members);
  context.groups.emplace(members, out);
  return out;
}

std::shared_ptr<Communicator> make_world_communicator(ProcessContext& context) {
  return make_communicator(context, context.devices);
}

}  // namespace meshflow::mpi
