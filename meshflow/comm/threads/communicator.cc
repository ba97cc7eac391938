// Shared-memory collective algorithms. Rank r of n; P[k] is rank k's published options. Every
// step's copies and reductions are pieces any rank may run (world.h).
//   all_gather      r copies every rank's block straight into its own recv (n - 1 copies).
//   reduce_scatter  r reduces block r of every rank's send, in rank order, into its recv.
//   all_reduce      reduce-scatter into each rank's own recv (chunk r by rank r), then, once
//                   every chunk is reduced, r copies every other chunk from its owner's recv:
//                   bandwidth-optimal, every chunk reduced once so all ranks hold the same bits.
//   all_to_all      r copies block r of every rank's send into its recv.
//   broadcast       every non-root copies from the root.
//   permute(k)      r copies from rank (r + k) mod n, which is the rank that sends to r.
//   exchange_boxes  1 MiB slabs of every sender's rows, each copied to every receiver a few rows
//                   at a time.
// A copy step that moves at least half the last-level cache writes with streaming stores.
// Every collective ends when every piece of its last step is done, after which no rank reads
// another's buffers; all_reduce's copies start once every reduction piece is done.
#include "meshflow/comm/threads/communicator.h"

#include <algorithm>

#include "meshflow/core/copy.h"
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
// The most waits any algorithm here makes (the arrival, then each step's pieces); each is
// bounded by the collective's timeout.
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

// Bulk work is cut into pieces of at most this many bytes, so that the ranks that are running
// can share a phase's work evenly (a quarter of a typical L2 cache).
constexpr std::int64_t kPieceBytes = 256 << 10;

// exchange_boxes pieces are slabs of a source tensor, each copied to every destination it
// feeds; larger slabs amortise the per-region set-up over more rows (measured on the reference
// machine: 1 MiB slabs run S(0)->S(1) at 256 MiB in 0.83x the time of 256 KiB ones).
constexpr std::int64_t kSourcePieceBytes = 1 << 20;

// Within a slab, exchange_boxes copies this many bytes of source rows to every destination
// before it moves on: small enough to stay in the first-level cache.
constexpr std::int64_t kRowGroupBytes = 16 << 10;

struct CopyPiece {
  std::byte* dst;
  const std::byte* src;
  std::int64_t bytes;
};

// Appends the copy of `bytes` from src to dst, cut into pieces (nothing when dst == src).
void add_copy(std::vector<CopyPiece>& pieces, std::byte* dst, const std::byte* src,
              std::int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  for (std::int64_t off = 0; off < bytes; off += kPieceBytes) {
    pieces.push_back({dst + off, src + off, std::min(kPieceBytes, bytes - off)});
  }
}

// One step of shared work of collective `seq`: its number, and the bound and name its wait
// for the other ranks' pieces carries.
struct StepOf {
  std::uint64_t seq;
  int step;
  Timeout timeout;
  const std::string& what;
};

// Runs fn(i) for every piece i < count that this rank claims in the step, then waits until
// every piece of it is done, by whichever rank.
template <typename Fn>
void share(Group& group, const StepOf& s, std::int64_t count, Fn fn) {
  std::int64_t done = 0;
  for (std::int64_t i = group.claim(s.seq, s.step); i < count; i = group.claim(s.seq, s.step)) {
    fn(i);
    ++done;
  }
  group.finish(s.seq, s.step, done, count, s.timeout, s.what);
}

// Runs the pieces of one copy step. A step that moves at least half the last-level cache writes
// with streaming stores, as exchange_boxes does, each piece fenced before it counts as done.
void run_copies(Group& group, const StepOf& s, const std::vector<CopyPiece>& pieces) {
  std::int64_t total = 0;
  for (const CopyPiece& q : pieces) total += q.bytes;
  const Store store = store_for_copy_of(total);
  share(group, s, static_cast<std::int64_t>(pieces.size()), [&](std::int64_t i) {
    copy_bytes(pieces[i].dst, pieces[i].src, static_cast<std::size_t>(pieces[i].bytes), store);
    if (store == Store::kStreaming) store_fence();
  });
}

// A reduction piece: elements [lo, lo + count) of block `block`.
struct ReducePiece {
  int block;
  std::int64_t lo;
  std::int64_t count;
};

// Appends the pieces of reducing `count` elements of block `block`.
void add_reduce(std::vector<ReducePiece>& pieces, int block, std::int64_t count, std::size_t elem) {
  const std::int64_t step =
      std::max<std::int64_t>(1, kPieceBytes / static_cast<std::int64_t>(elem));
  for (std::int64_t lo = 0; lo < count; lo += step)
    pieces.push_back({block, lo, std::min(step, count - lo)});
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

// Every rank validates every rank's arguments before any work starts, so all ranks fail
// together and no piece ever runs on inconsistent arguments.

Event ThreadsCommunicator::all_gather(const AllGatherOptions& o, Completion c) {
  check_counts(*this, "all_gather", "recv_counts", o.recv_counts);
  return start(
      "all_gather", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const AllGatherOptions>& opts, Timeout t,
             const std::string& what) {
        auto p = as<AllGatherOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "recv_counts",
                    [](const AllGatherOptions& x) { return x.recv_counts; });
        check_agree(p, devices(), what, "dtype", [](const AllGatherOptions& x) { return x.dtype; });
        const auto es = static_cast<std::int64_t>(size_of(opts->dtype));
        const auto displ = displacements(opts->recv_counts);
        const int n = size();
        std::vector<CopyPiece> pieces;
        for (int r = 0; r < n; ++r) {
          for (int i = 0; i < n; ++i) {
            const int k = (r + i) % n;  // each destination starts at a different source
            add_copy(pieces, p[r]->recv + displ[k] * es, p[k]->send, opts->recv_counts[k] * es);
          }
        }
        run_copies(*group_, {seq, 0, t, what}, pieces);
      });
}

Event ThreadsCommunicator::reduce_scatter(const ReduceScatterOptions& o, Completion c) {
  check_counts(*this, "reduce_scatter", "recv_counts", o.recv_counts);
  return start(
      "reduce_scatter", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const ReduceScatterOptions>& opts, Timeout t,
             const std::string& what) {
        auto p = as<ReduceScatterOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "recv_counts",
                    [](const ReduceScatterOptions& x) { return x.recv_counts; });
        check_agree(p, devices(), what, "dtype and op",
                    [](const ReduceScatterOptions& x) { return std::pair(x.dtype, x.op); });
        const std::size_t es = size_of(opts->dtype);
        const auto displ = displacements(opts->recv_counts);
        const int n = size();
        std::vector<ReducePiece> pieces;
        for (int r = 0; r < n; ++r) add_reduce(pieces, r, opts->recv_counts[r], es);
        share(*group_, {seq, 0, t, what}, static_cast<std::int64_t>(pieces.size()),
              [&](std::int64_t i) {
                const ReducePiece& q = pieces[i];
                std::vector<const std::byte*> terms;
                for (const auto* k : p) terms.push_back(k->send + (displ[q.block] + q.lo) * es);
                reduce_terms(opts->op, opts->dtype, terms, p[q.block]->recv + q.lo * es, q.count);
              });
      });
}

Event ThreadsCommunicator::all_reduce(const AllReduceOptions& o, Completion c) {
  check_count(*this, "all_reduce", o.count);
  return start(
      "all_reduce", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const AllReduceOptions>& opts, Timeout t,
             const std::string& what) {
        auto p = as<AllReduceOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "count, dtype and op",
                    [](const AllReduceOptions& x) { return std::tuple(x.count, x.dtype, x.op); });
        const int n = size();
        const std::size_t es = size_of(opts->dtype);
        // Chunk k = [k*chunk, min(count, (k+1)*chunk)), chunk = ceil(count / n), is reduced
        // once, into rank k's recv, then copied to every other rank.
        const std::int64_t count = opts->count;
        const std::int64_t chunk = (count + n - 1) / n;
        auto lo = [&](int k) { return std::min<std::int64_t>(count, k * chunk); };
        auto len = [&](int k) { return std::min<std::int64_t>(count, (k + 1) * chunk) - lo(k); };
        std::vector<ReducePiece> reduce;
        for (int k = 0; k < n; ++k) add_reduce(reduce, k, len(k), es);
        // Every chunk is reduced (and, in place, no send chunk is still needed) before any copy:
        // share returns once every piece of the step is done.
        share(*group_, {seq, 0, t, what}, static_cast<std::int64_t>(reduce.size()),
              [&](std::int64_t i) {
                const ReducePiece& q = reduce[i];
                const std::int64_t at = (lo(q.block) + q.lo) * static_cast<std::int64_t>(es);
                std::vector<const std::byte*> terms;
                for (const auto* k : p) terms.push_back(k->send + at);
                reduce_terms(opts->op, opts->dtype, terms, p[q.block]->recv + at, q.count);
              });
        std::vector<CopyPiece> copies;
        for (int r = 0; r < n; ++r) {
          for (int i = 1; i < n; ++i) {
            const int k = (r + i) % n;
            const std::int64_t at = lo(k) * static_cast<std::int64_t>(es);
            add_copy(copies, p[r]->recv + at, p[k]->recv + at,
                     len(k) * static_cast<std::int64_t>(es));
          }
        }
        run_copies(*group_, {seq, 1, t, what}, copies);
      });
}

Event ThreadsCommunicator::all_to_all(const AllToAllOptions& o, Completion c) {
  check_counts(*this, "all_to_all", "send_counts", o.send_counts);
  check_counts(*this, "all_to_all", "recv_counts", o.recv_counts);
  return start("all_to_all", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const AllToAllOptions>& opts,
                      Timeout t, const std::string& what) {
                 auto p = as<AllToAllOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "dtype",
                             [](const AllToAllOptions& x) { return x.dtype; });
                 const int n = size();
                 for (int r = 0; r < n; ++r) {
                   for (int k = 0; k < n; ++k) {
                     if (p[k]->send_counts[r] != p[r]->recv_counts[k]) {
                       fail(ErrorKind::kInvalidArgument,
                            "{}: device {} sends {} elements to device {}, which expects {}", what,
                            devices()[k], p[k]->send_counts[r], devices()[r], p[r]->recv_counts[k]);
                     }
                   }
                 }
                 const auto es = static_cast<std::int64_t>(size_of(opts->dtype));
                 std::vector<CopyPiece> pieces;
                 for (int r = 0; r < n; ++r) {
                   const auto rdispl = displacements(p[r]->recv_counts);
                   for (int i = 0; i < n; ++i) {
                     const int k = (r + i) % n;
                     const std::int64_t sdispl = displacements(p[k]->send_counts)[r];
                     add_copy(pieces, p[r]->recv + rdispl[k] * es, p[k]->send + sdispl * es,
                              p[r]->recv_counts[k] * es);
                   }
                 }
                 run_copies(*group_, {seq, 0, t, what}, pieces);
               });
}

Event ThreadsCommunicator::broadcast(const BroadcastOptions& o, Completion c) {
  check_rank(*this, "broadcast", "root", o.root);
  check_count(*this, "broadcast", o.count);
  return start(
      "broadcast", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const BroadcastOptions>& opts, Timeout t,
             const std::string& what) {
        auto p = as<BroadcastOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "count, dtype and root",
                    [](const BroadcastOptions& x) { return std::tuple(x.count, x.dtype, x.root); });
        const std::int64_t bytes = opts->count * static_cast<std::int64_t>(size_of(opts->dtype));
        std::vector<CopyPiece> pieces;
        for (int r = 0; r < size(); ++r) {
          if (r != index(opts->root))
            add_copy(pieces, p[r]->data, p[index(opts->root)]->data, bytes);
        }
        run_copies(*group_, {seq, 0, t, what}, pieces);
      });
}

Event ThreadsCommunicator::collective_permute(const PermuteOptions& o, Completion c) {
  check_count(*this, "collective_permute", o.send_count);
  check_count(*this, "collective_permute", o.recv_count);
  return start("collective_permute", o, c,
               [this](std::uint64_t seq, const std::shared_ptr<const PermuteOptions>& opts,
                      Timeout t, const std::string& what) {
                 auto p = as<PermuteOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
                 check_agree(p, devices(), what, "shift and dtype",
                             [](const PermuteOptions& x) { return std::pair(x.shift, x.dtype); });
                 const int n = size();
                 const auto es = static_cast<std::int64_t>(size_of(opts->dtype));
                 std::vector<CopyPiece> pieces;
                 for (int r = 0; r < n; ++r) {
                   const int from = ((r + opts->shift) % n + n) % n;
                   if (p[from]->send_count != p[r]->recv_count) {
                     fail(ErrorKind::kInvalidArgument,
                          "{}: device {} sends {} elements but device {} expects {}", what,
                          devices()[from], p[from]->send_count, devices()[r], p[r]->recv_count);
                   }
                   add_copy(pieces, p[r]->recv, p[from]->send, p[r]->recv_count * es);
                 }
                 run_copies(*group_, {seq, 0, t, what}, pieces);
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
  return start(
      "exchange_boxes", o, c,
      [this](std::uint64_t seq, const std::shared_ptr<const ExchangeBoxesOptions>& opts, Timeout t,
             const std::string& what) {
        auto p = as<ExchangeBoxesOptions>(group_->arrive(seq, rank_, 0, opts, t, what));
        check_agree(p, devices(), what, "dtype",
                    [](const ExchangeBoxesOptions& x) { return x.dtype; });
        const int n = size();
        for (int r = 0; r < n; ++r) {
          for (int k = 0; k < n; ++k) {
            const auto& theirs = p[k]->send[r];
            const auto& mine = p[r]->recv[k];
            if (theirs.size() != mine.size()) {
              fail(ErrorKind::kInvalidArgument,
                   "{}: device {} sends {} regions to device {}, which expects {}", what,
                   devices()[k], theirs.size(), devices()[r], mine.size());
            }
            for (std::size_t j = 0; j < mine.size(); ++j) {
              if (theirs[j].extent != mine[j].extent) {
                fail(ErrorKind::kInvalidArgument,
                     "{}: region {} from device {} does not fit region {} of device {}", what,
                     to_string(theirs[j]), devices()[k], to_string(mine[j]), devices()[r]);
              }
            }
          }
        }
        // Source-major pieces: a piece is a slab of rows [lo, hi) of one source tensor (about
        // kSourcePieceBytes), and copies every region any rank receives from those rows, a few
        // rows at a time: each source row is read from memory once and in order, whatever the
        // number of destinations, and every destination is written in order.
        struct SourcePiece {
          int src;
          std::int64_t lo, hi;
        };
        const std::size_t es = size_of(opts->dtype);
        std::vector<SourcePiece> pieces;
        std::vector<std::int64_t> row_bytes(n);
        std::int64_t total = 0;
        for (int k = 0; k < n; ++k) {
          const Shape& shape = p[k]->src_shape;
          const std::int64_t rows = shape.empty() ? 1 : shape[0];
          row_bytes[k] = rows == 0 ? 0 : numel(shape) / rows * static_cast<std::int64_t>(es);
          const std::int64_t step = std::max<std::int64_t>(
              1, kSourcePieceBytes / std::max<std::int64_t>(1, row_bytes[k]));
          for (std::int64_t lo = 0; lo < rows; lo += step)
            pieces.push_back({k, lo, std::min(rows, lo + step)});
          for (const auto& regions : p[k]->send)
            for (const Box& b : regions) total += numel(b) * static_cast<std::int64_t>(es);
        }
        // Where the exchange's reads and writes together outgrow the cache, its destinations
        // are written with streaming stores (nothing would stay cached, and an ordinary store
        // first reads the line it writes).
        const Store store = store_for_copy_of(total);
        share(*group_, {seq, 0, t, what}, static_cast<std::int64_t>(pieces.size()),
              [&](std::int64_t i) {
                const SourcePiece& q = pieces[i];
                const ExchangeBoxesOptions& src = *p[q.src];
                // Every region received from the slab, clipped to it: its copy starts at
                // source row `first`.
                struct Region {
                  BoxCopy copy;
                  std::int64_t first;
                };
                std::vector<Region> regions;
                std::vector<std::int64_t> src_off, dst_off, extent;
                for (int d = 0; d < n; ++d) {
                  const int r = (q.src + d) % n;
                  const auto& sends = src.send[r];
                  for (std::size_t j = 0; j < sends.size(); ++j) {
                    const Box& from = sends[j];
                    const Box& to = p[r]->recv[q.src][j];
                    if (numel(from) == 0) continue;
                    src_off.assign(from.offset.begin(), from.offset.end());
                    dst_off.assign(to.offset.begin(), to.offset.end());
                    extent.assign(to.extent.begin(), to.extent.end());
                    std::int64_t first = 0;
                    if (!extent.empty()) {
                      first = std::max(q.lo, from.offset[0]);
                      const std::int64_t hi = std::min(q.hi, from.offset[0] + from.extent[0]);
                      if (first >= hi) continue;
                      src_off[0] = first;
                      dst_off[0] += first - from.offset[0];
                      extent[0] = hi - first;
                    }
                    regions.push_back(
                        {prepare_box_copy(ConstBuffer{src.src, &src.src_shape, es}, src_off,
                                          MutableBuffer{p[r]->dst, &p[r]->dst_shape, es}, dst_off,
                                          extent),
                         first});
                  }
                }
                // A few source rows at a time (about kRowGroupBytes, at least one row), every
                // region's part of them in turn: the rows stay in the core's cache while they
                // are read.
                const std::int64_t group = std::max<std::int64_t>(
                    1, kRowGroupBytes / std::max<std::int64_t>(1, row_bytes[q.src]));
                for (std::int64_t row = q.lo; row < q.hi; row += group) {
                  const std::int64_t end = std::min(q.hi, row + group);
                  for (const Region& g : regions) {
                    const std::int64_t lo = std::max(row, g.first);
                    const std::int64_t hi = std::min(end, g.first + box_copy_rows(g.copy));
                    if (lo < hi) run_box_copy(g.copy, lo - g.first, hi - lo, store);
                  }
                }
                if (store == Store::kStreaming) store_fence();
              });
      });
}

Event ThreadsCommunicator::send(const SendOptions& o, Completion) {
  check_rank(*this, "send", "peer", o.peer);
  check_count(*this, "send", o.count);
  auto state = std::make_shared<EventState>(fmt::format("send from device {} to device {} tag {}",
                                                        device(), devices()[index(o.peer)], o.tag));
  group_->post_send(rank_, index(o.peer), o.tag, o.data,
                    o.count * static_cast<std::int64_t>(size_of(o.dtype)), state);
  return Event(state);
}

Event ThreadsCommunicator::recv(const RecvOptions& o, Completion) {
  check_rank(*this, "recv", "peer", o.peer);
  check_count(*this, "recv", o.count);
  auto state = std::make_shared<EventState>(fmt::format("recv on device {} from device {} tag {}",
                                                        device(), devices()[index(o.peer)], o.tag));
  group_->post_recv(index(o.peer), rank_, o.tag, o.data,
                    o.count * static_cast<std::int64_t>(size_of(o.dtype)), state);
  return Event(state);
}

std::shared_ptr<Communicator> ThreadsCommunicator::group(const std::vector<DeviceId>& members) {
  auto it = context_->groups.find(members);
  if (it != context_->groups.end()) return it->second;
  check_members(members, device(), context_->world.devices());
  const int my_rank =
      static_cast<int>(std::find(members.begin(), members.end(), device()) - members.begin());
  auto comm =
      std::make_shared<ThreadsCommunicator>(context_, context_->world.group(members), my_rank);
  context_->groups.emplace(members, comm);
  return comm;
}

std::shared_ptr<Communicator> world_communicator(DeviceContext& context) {
  const std::vector<DeviceId>& all = context.world.devices();
  const int rank = context.world.index_of(context.device);
  auto comm = std::make_shared<ThreadsCommunicator>(&context, context.world.group(all), rank);
  context.groups.emplace(all, comm);
  return comm;
}

}  // namespace meshflow::threads
