// Shared-memory collective algorithms. Rank r of n; P[k] is rank k's published options.
//   all_gather      r copies every rank's block straight into its own recv (n - 1 copies).
//   reduce_scatter  r reduces block r of every rank's send, in rank order, into its recv.
//   all_reduce      reduce-scatter into each rank's own recv (chunk r by rank r), a barrier,
//                   then r copies every other chunk from its owner's recv: bandwidth-optimal,
//                   every chunk reduced once so all ranks hold the same bits.
//   all_to_all      r copies block r of every rank's send into its recv.
//   broadcast       every non-root copies from the root.
//   permute(k)      r copies from rank (r + k) mod n, which is the rank that sends to r.
// Every collective ends with an exit barrier, after which no rank reads another's buffers.
#include "meshflow/comm/threads/communicator.h"

#include <algorithm>
#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow::threads {

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() { drain(); }

void Worker::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

bool Worker::idle() {
  std::lock_guard lock(mu_);
  return tasks_.empty() && !running_;
}

void Worker::drain() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Worker::loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    task();
    std::lock_guard lock(mu_);
    running_ = false;
  }
}

ThreadsCommunicator::ThreadsCommunicator(DeviceContext* context, std::shared_ptr<Group> group,
                                         int rank)
    : context_(context), group_(std::move(group)), rank_(rank) {}

namespace {
// The most barriers any algorithm here waits at; each is bounded by the collective's timeout.
constexpr int kMaxPhases = 3;
}  // namespace

template <typename Options, typename Body>
Event ThreadsCommunicator::start(std::string_view name, const Options& o, Completion c, Body body) {
  const std::uint64_t seq = next_seq_++;
  auto what = std::make_shared<std::string>(describe(name, devices()));
  auto state = std::make_shared<EventState>(*what);
  auto opts = std::make_shared<const Options>(o);
  const Timeout timeout = resolve_timeout(*this, o.timeout);
  auto task = [this, seq, what, state, opts, timeout, body] {
    try {
      body(seq, opts, timeout, *what);
      group_->leave(seq, rank_);
      state->complete();
    } catch (...) {
      group_->leave(seq, rank_);
      state->fail(std::current_exception());
    }
  };
  Event event(state);
  if (c == Completion::kWait && context_->worker.idle()) {
    // Nothing is queued before it: run on the calling thread and save two thread hand-offs.
    task();
  } else {
    context_->worker.post(std::move(task));
  }
  // The worker reports a peer's timeout or failure precisely; waiting here for every phase's
  // bound is only a backstop, so a blocking call returns the worker's own error.
  if (c == Completion::kWait) event.wait(timeout * (kMaxPhases + 1));
  return event;
}

namespace {

template <typename Options>
std::vector<const Options*> as(const std::vector<const void*>& args) {
  std::vector<const Options*> out;
  for (const void* a : args) out.push_back(static_cast<const Options*>(a));
  return out;
}

void copy_block(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

// Checks that every rank passed the same value of a field; throws naming the first mismatch.
template <typename Options, typename Field>
void check_agree(const std::vector<const Options*>& p, const std::vector<DeviceId>& devices,
                 const std::string& what, const char* field_name, Field field) {
  for (std::size_t k = 1; k < p.size(); ++k) {
    if (!(field(*p[k]) == field(*p[0]))) {
      fail(ErrorKind::kInvalidArgument, "{}: devices {} and {} disagree on {}", what, devices[0],
           devices[k], field_name);
    }
  }
}

}  // namespace

Event ThreadsCommunicator::all_gather(const AllGatherOptions& o, Completion c) {
  check_counts(*this, "all_gather", "recv_counts", o.recv_counts);
  return start("all_gather", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const AllGatherOptions>& opts,
                      Timeout t, const std::string& what) {
                 const AllGatherOptions& me = *opts;
                 auto p = as<AllGatherOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "recv_counts",
                             [](const AllGatherOptions& x) { return x.recv_counts; });
                 check_agree(p, devices(), what, "dtype",
                             [](const AllGatherOptions& x) { return x.dtype; });
                 const auto es = static_cast<std::int64_t>(size_of(me.dtype));
                 const auto displ = displacements(me.recv_counts);
                 const int n = size();
                 for (int i = 0; i < n; ++i) {
                   const int k = (rank_ + i) % n;  // start at a different source on every rank
                   copy_block(me.recv + displ[k] * es, p[k]->send, me.recv_counts[k] * es);
                 }
                 group_->arrive(seq, rank_, 1, nullptr, t, what);
               });
}

Event ThreadsCommunicator::reduce_scatter(const ReduceScatterOptions& o, Completion c) {
  check_counts(*this, "reduce_scatter", "recv_counts", o.recv_counts);
  return start("reduce_scatter", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const ReduceScatterOptions>& opts,
                      Timeout t, const std::string& what) {
                 const ReduceScatterOptions& me = *opts;
                 auto p = as<ReduceScatterOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "recv_counts",
                             [](const ReduceScatterOptions& x) { return x.recv_counts; });
                 check_agree(p, devices(), what, "dtype and op", [](const ReduceScatterOptions& x) {
                   return std::pair(x.dtype, x.op);
                 });
                 const auto es = static_cast<std::int64_t>(size_of(me.dtype));
                 const std::int64_t offset = displacements(me.recv_counts)[rank_] * es;
                 std::vector<const std::byte*> terms;
                 for (const auto* k : p) terms.push_back(k->send + offset);
                 reduce_terms(me.op, me.dtype, terms, me.recv, me.recv_counts[rank_]);
                 group_->arrive(seq, rank_, 1, nullptr, t, what);
               });
}

Event ThreadsCommunicator::all_reduce(const AllReduceOptions& o, Completion c) {
  if (o.count < 0)
    fail(ErrorKind::kInvalidArgument, "{}: negative count {}", describe("all_reduce", devices()),
         o.count);
  return start(
      "all_reduce", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const AllReduceOptions>& opts, Timeout t,
             const std::string& what) {
        const AllReduceOptions& me = *opts;
        auto p = as<AllReduceOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "count, dtype and op",
                    [](const AllReduceOptions& x) { return std::tuple(x.count, x.dtype, x.op); });
        const int n = size();
        const auto es = static_cast<std::int64_t>(size_of(me.dtype));
        // Chunk k = [k*chunk, min(count, (k+1)*chunk)), chunk = ceil(count / n).
        const std::int64_t chunk = (me.count + n - 1) / n;
        auto lo = [&](int k) { return std::min<std::int64_t>(me.count, k * chunk); };
        auto len = [&](int k) { return std::min<std::int64_t>(me.count, (k + 1) * chunk) - lo(k); };
        std::vector<const std::byte*> terms;
        for (const auto* k : p) terms.push_back(k->send + lo(rank_) * es);
        reduce_terms(me.op, me.dtype, terms, me.recv + lo(rank_) * es, len(rank_));
        // Every chunk is reduced (and, in place, no send chunk is still needed) before any copy.
        group_->arrive(seq, rank_, 1, nullptr, t, what);
        for (int i = 1; i < n; ++i) {
          const int k = (rank_ + i) % n;
          copy_block(me.recv + lo(k) * es, p[k]->recv + lo(k) * es, len(k) * es);
        }
        group_->arrive(seq, rank_, 2, nullptr, t, what);
      });
}

Event ThreadsCommunicator::all_to_all(const AllToAllOptions& o, Completion c) {
  check_counts(*this, "all_to_all", "send_counts", o.send_counts);
  check_counts(*this, "all_to_all", "recv_counts", o.recv_counts);
  return start(
      "all_to_all", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const AllToAllOptions>& opts, Timeout t,
             const std::string& what) {
        const AllToAllOptions& me = *opts;
        auto p = as<AllToAllOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "dtype", [](const AllToAllOptions& x) { return x.dtype; });
        const int n = size();
        for (int k = 0; k < n; ++k) {
          if (p[k]->send_counts[rank_] != me.recv_counts[k]) {
            fail(ErrorKind::kInvalidArgument,
                 "{}: device {} sends {} elements to device {}, which expects {}", what,
                 devices()[k], p[k]->send_counts[rank_], devices()[rank_], me.recv_counts[k]);
          }
        }
        const auto es = static_cast<std::int64_t>(size_of(me.dtype));
        const auto rdispl = displacements(me.recv_counts);
        for (int i = 0; i < n; ++i) {
          const int k = (rank_ + i) % n;
          const std::int64_t sdispl = displacements(p[k]->send_counts)[rank_];
          copy_block(me.recv + rdispl[k] * es, p[k]->send + sdispl * es, me.recv_counts[k] * es);
        }
        group_->arrive(seq, rank_, 1, nullptr, t, what);
      });
}

Event ThreadsCommunicator::broadcast(const BroadcastOptions& o, Completion c) {
  if (o.root < 0 || o.root >= size()) {
    fail(ErrorKind::kInvalidArgument, "{}: root rank {} out of range",
         describe("broadcast", devices()), o.root);
  }
  return start(
      "broadcast", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const BroadcastOptions>& opts, Timeout t,
             const std::string& what) {
        const BroadcastOptions& me = *opts;
        auto p = as<BroadcastOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "count, dtype and root",
                    [](const BroadcastOptions& x) { return std::tuple(x.count, x.dtype, x.root); });
        if (rank_ != me.root)
          copy_block(me.data, p[me.root]->data,
                     me.count * static_cast<std::int64_t>(size_of(me.dtype)));
        group_->arrive(seq, rank_, 1, nullptr, t, what);
      });
}

Event ThreadsCommunicator::collective_permute(const PermuteOptions& o, Completion c) {
  return start("collective_permute", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const PermuteOptions>& opts,
                      Timeout t, const std::string& what) {
                 const PermuteOptions& me = *opts;
                 auto p = as<PermuteOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "shift and dtype",
                             [](const PermuteOptions& x) { return std::pair(x.shift, x.dtype); });
                 const int n = size();
                 const int from = ((rank_ + me.shift) % n + n) % n;
                 if (p[from]->send_count != me.recv_count) {
                   fail(ErrorKind::kInvalidArgument,
                        "{}: device {} sends {} elements but device {} expects {}", what,
                        devices()[from], p[from]->send_count, devices()[rank_], me.recv_count);
                 }
                 copy_block(me.recv, p[from]->send,
                            me.recv_count * static_cast<std::int64_t>(size_of(me.dtype)));
                 group_->arrive(seq, rank_, 1, nullptr, t, what);
               });
}

Event ThreadsCommunicator::barrier(const BarrierOptions& o, Completion c) {
  return start(
      "barrier", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const BarrierOptions>& opts, Timeout t,
             const std::string& what) { group_->arrive(seq, rank_, 0, opts, t, what); });
}

Event ThreadsCommunicator::exchange_boxes(const ExchangeBoxesOptions& o, Completion c) {
  check_exchange(*this, o);
  return start("exchange_boxes", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const ExchangeBoxesOptions>& opts,
                      Timeout t, const std::string& what) {
                 const ExchangeBoxesOptions& me = *opts;
                 auto p = as<ExchangeBoxesOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "dtype",
                             [](const ExchangeBoxesOptions& x) { return x.dtype; });
                 const int n = size();
                 const std::size_t es = size_of(me.dtype);
                 for (int i = 0; i < n; ++i) {
                   const int k = (rank_ + i) % n;
                   const auto& theirs = p[k]->send[rank_];
                   const auto& mine = me.recv[k];
                   if (theirs.size() != mine.size()) {
                     fail(ErrorKind::kInvalidArgument,
                          "{}: device {} sends {} regions to device {}, which expects {}", what,
                          devices()[k], theirs.size(), device(), mine.size());
                   }
                   for (std::size_t j = 0; j < mine.size(); ++j) {
                     if (theirs[j].extent != mine[j].extent) {
                       fail(ErrorKind::kInvalidArgument,
                            "{}: region {} from device {} does not fit region {} of device {}",
                            what, to_string(theirs[j]), devices()[k], to_string(mine[j]), device());
                     }
                     copy_box(ConstBuffer{p[k]->src, &p[k]->src_shape, es}, theirs[j].offset,
                              MutableBuffer{me.dst, &me.dst_shape, es}, mine[j].offset,
                              mine[j].extent);
                   }
                 }
                 group_->arrive(seq, rank_, 1, nullptr, t, what);
               });
}

namespace {

void check_peer(const Communicator& comm, std::string_view op, int peer, std::int64_t count) {
  if (peer < 0 || peer >= comm.size() || peer == comm.rank()) {
    fail(ErrorKind::kInvalidArgument, "{}: peer rank {} is out of range or this rank",
         describe(op, comm.devices()), peer);
  }
  if (count < 0)
    fail(ErrorKind::kInvalidArgument, "{}: negative count {}", describe(op, comm.devices()), count);
}

}  // namespace

Event ThreadsCommunicator::send(const SendOptions& o, Completion) {
  check_peer(*this, "send", o.peer, o.count);
  auto state = std::make_shared<EventState>(
      fmt::format("send from device {} to device {} tag {}", device(), devices()[o.peer], o.tag));
  group_->post_send(rank_, o.peer, o.tag, o.data,
                    o.count * static_cast<std::int64_t>(size_of(o.dtype)), state);
  return Event(state);
}

Event ThreadsCommunicator::recv(const RecvOptions& o, Completion) {
  check_peer(*this, "recv", o.peer, o.count);
  auto state = std::make_shared<EventState>(
      fmt::format("recv on device {} from device {} tag {}", device(), devices()[o.peer], o.tag));
  group_->post_recv(o.peer, rank_, o.tag, o.data,
                    o.count * static_cast<std::int64_t>(size_of(o.dtype)), state);
  return Event(state);
}

std::shared_ptr<Communicator> ThreadsCommunicator::group(const std::vector<DeviceId>& members) {
  auto it = context_->groups.find(members);
  if (it != context_->groups.end()) return it->second;
  int my_rank = -1;
  std::vector<DeviceId> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    fail(ErrorKind::kInvalidArgument, "{}: a device is listed twice", describe("group", members));
  }
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= context_->world.size()) {
      fail(ErrorKind::kInvalidArgument, "group names device {} but the world has devices 0..{}",
           members[i], context_->world.size() - 1);
    }
    if (members[i] == device()) my_rank = static_cast<int>(i);
  }
  if (my_rank < 0)
    fail(ErrorKind::kInvalidArgument, "{}: device {} is not a member", describe("group", members),
         device());
  auto comm =
      std::make_shared<ThreadsCommunicator>(context_, context_->world.group(members), my_rank);
  context_->groups.emplace(members, comm);
  return comm;
}

std::shared_ptr<Communicator> world_communicator(DeviceContext& context) {
  std::vector<DeviceId> all(context.world.size());
  for (int i = 0; i < context.world.size(); ++i) all[i] = i;
  auto comm =
      std::make_shared<ThreadsCommunicator>(&context, context.world.group(all), context.device);
  context.groups.emplace(all, comm);
  return comm;
}

}  // namespace meshflow::threads
