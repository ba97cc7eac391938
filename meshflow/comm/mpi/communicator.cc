// MPI collectives behind the Communicator interface. A blocking call is the blocking MPI call
// itself (so it costs what MPI costs); an asynchronous call starts the MPI_I* form and returns
// an event whose wait polls MPI_Testall. avg is MPI_SUM followed by a local division, the same on
// every rank, so all ranks keep identical bits.
#include "meshflow/comm/mpi/communicator.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <optional>

#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"

namespace meshflow::mpi {

void check(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ErrorKind::kCommunication, "{} failed: {}", what, std::string(text, len));
}

namespace {

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

// MPI counts are ints.
int as_int(std::int64_t count, std::string_view what) {
  return checked_int(count, 0, INT_MAX, fmt::format("{}: an MPI count", what));
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

namespace {

// Returns the MPI datatype of one box of a row-major tensor of `shape` (elements of type `elem`,
// `es` bytes), at displacement 0 from the tensor's start: trailing dims the box spans fully form
// one contiguous block, each outer dim one hvector (64-bit byte strides), and the box's offset
// one more displacement. The caller frees it.
MPI_Datatype box_type(const Box& box, const Shape& shape, MPI_Datatype elem, std::int64_t es,
                      const std::string& what) {
  const std::size_t rank = shape.size();
  std::size_t split = rank;
  std::int64_t run = 1;
  while (split > 0) {
    const std::size_t d = split - 1;
    run *= box.extent[d];
    --split;
    if (box.extent[d] != shape[d]) break;
  }
  const auto strides = row_major_strides(shape);
  MPI_Datatype t;
  MPI_Type_contiguous(as_int(run, what), elem, &t);
  for (std::size_t d = split; d-- > 0;) {
    MPI_Datatype outer;
    MPI_Type_create_hvector(as_int(box.extent[d], what), 1, static_cast<MPI_Aint>(strides[d] * es),
                            t, &outer);
    MPI_Type_free(&t);
    t = outer;
  }
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < rank; ++d) offset += box.offset[d] * strides[d];
  int one = 1;
  MPI_Aint displacement = static_cast<MPI_Aint>(offset * es);
  MPI_Datatype placed;
  MPI_Type_create_struct(1, &one, &displacement, &t, &placed);
  MPI_Type_free(&t);
  return placed;
}

// Returns the committed datatype of every non-empty box of `boxes` together (in order), or
// MPI_DATATYPE_NULL when they hold no element.
MPI_Datatype regions_type(const std::vector<Box>& boxes, const Shape& shape, MPI_Datatype elem,
                          std::int64_t es, const std::string& what) {
  std::vector<MPI_Datatype> parts;
  for (const Box& b : boxes) {
    if (numel(b) > 0) parts.push_back(box_type(b, shape, elem, es, what));
  }
  if (parts.empty()) return MPI_DATATYPE_NULL;
  MPI_Datatype out = parts[0];
  if (parts.size() > 1) {
    std::vector<int> ones(parts.size(), 1);
    std::vector<MPI_Aint> zeros(parts.size(), 0);
    MPI_Type_create_struct(static_cast<int>(parts.size()), ones.data(), zeros.data(), parts.data(),
                           &out);
    for (MPI_Datatype& p : parts) MPI_Type_free(&p);
  }
  MPI_Type_commit(&out);
  return out;
}

// Returns the element offset and count of `boxes` when their non-empty members are one
// contiguous run of the tensor `all` (one box, or none); nullopt otherwise.
std::optional<std::pair<std::int64_t, std::int64_t>> single_run(const std::vector<Box>& boxes,
                                                                const Box& all) {
  std::optional<std::int64_t> at;
  std::int64_t count = 0;
  for (const Box& b : boxes) {
    if (numel(b) == 0) continue;
    if (at) return std::nullopt;
    at = contiguous_offset(b, all);
    if (!at) return std::nullopt;
    count = numel(b);
  }
  return std::pair{at.value_or(0), count};
}

std::int64_t elements(const std::vector<Box>& boxes) {
  std::int64_t n = 0;
  for (const Box& b : boxes) n += numel(b);
  return n;
}

// What an exchange keeps alive until it completes: the derived datatypes of its strided sends
// and receives.
struct ExchangeState {
  std::vector<MPI_Datatype> types;
  ~ExchangeState() {
    for (MPI_Datatype& t : types) MPI_Type_free(&t);
  }
};

}  // namespace

Event MpiCommunicator::exchange_boxes(const ExchangeBoxesOptions& o, Completion c) {
  // Point to point with every peer, each side choosing its own form (so no agreement is needed):
  // a region list that is one contiguous run is sent from (or received into) the tensor itself,
  // any other by a derived datatype over the tensor, so nothing is staged by hand and nothing is
  // zero-filled. Derived sends rather than packing: Open MPI pipelines a strided send through
  // its shared-memory fragments, a copy on each side that overlaps, where a packed block is
  // copied whole before its transfer starts. On 4 ranks of 2 cores, S(0)->S(1) ran 0.92-1.00x
  // MPI's own strided collective (an MPI_Alltoall with a vector send type) at 16 and 256 MiB
  // this way, and 0.83-1.47x packed (whose buffer also cost 3/4 of a shard of memory).
  const std::string what = describe("exchange_boxes", devices_);
  check_exchange(*this, o);
  const int n = size();
  const auto es = static_cast<std::int64_t>(size_of(o.dtype));
  const auto esz = static_cast<std::size_t>(es);
  const MPI_Datatype elem = mpi_type(o.dtype);
  const Box src_all = full_box(o.src_shape), dst_all = full_box(o.dst_shape);
  auto state = std::make_shared<ExchangeState>();
  std::vector<MPI_Request> reqs;
  for (int i = 1; i < n; ++i) {
    const int k = (rank_ - i + n) % n;
    const std::int64_t count = elements(o.recv[k]);
    if (count == 0) continue;
    reqs.emplace_back();
    if (auto run = single_run(o.recv[k], dst_all)) {
      check(MPI_Irecv(o.dst + run->first * es, as_int(count, what), elem, k, /*tag=*/1, internal_,
                      &reqs.back()),
            what);
    } else {
      state->types.push_back(regions_type(o.recv[k], o.dst_shape, elem, es, what));
      check(MPI_Irecv(o.dst, 1, state->types.back(), k, /*tag=*/1, internal_, &reqs.back()), what);
    }
  }
  for (int i = 0; i < n; ++i) {
    const int k = (rank_ + i) % n;
    if (k == rank_) {  // this rank's own regions go straight from src to dst
      for (std::size_t j = 0; j < o.send[k].size(); ++j) {
        copy_box(ConstBuffer{o.src, &o.src_shape, esz}, o.send[k][j].offset,
                 MutableBuffer{o.dst, &o.dst_shape, esz}, o.recv[k][j].offset, o.recv[k][j].extent);
      }
      continue;
    }
    const std::int64_t count = elements(o.send[k]);
    if (count == 0) continue;
    reqs.emplace_back();
    if (auto run = single_run(o.send[k], src_all)) {
      check(MPI_Isend(o.src + run->first * es, as_int(count, what), elem, k, /*tag=*/1, internal_,
                      &reqs.back()),
            what);
    } else {
      state->types.push_back(regions_type(o.send[k], o.src_shape, elem, es, what));
      check(MPI_Isend(o.src, 1, state->types.back(), k, /*tag=*/1, internal_, &reqs.back()), what);
    }
  }
  if (c == Completion::kWait) {
    const auto armed = guard(what, o.timeout);
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), what);
    return Event();
  }
  return finish_event(what, std::move(reqs), nullptr, state);
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
