// Collective benchmark. Each repetition on every device: barrier, start the clock, run the
// case, stop; the time reported is the span from the first device's start to the last device's
// end. Then the same for its floor (threads) or the raw MPI call (mpi, baseline "mpi"). Floors (per
// rank r of n, S global bytes, blocks by the chunk rule):
//   all_gather       n memcpys of block k from rank k's send into r's recv.
//   reduce_scatter   n memcpys of block r of every rank's send into r's recv (one read of every
//                    term).
//   all_reduce       the bandwidth-optimal pattern: reduce-scatter's n memcpys of chunk r, then
//                    n - 1 memcpys of chunk k from rank k (twice the all-gather's bytes; read
//                    from rank k's send buffer, which no rank writes, so the floor has no race).
//   all_to_all       n memcpys of block r of rank k's send into r's recv.
//   broadcast        every non-root memcpys S from the root.
//   permute          one memcpy of S/n from rank (r + 1) mod n.
#include "bench/collectives_bench.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#ifdef MESHFLOW_HAVE_MPI
#include <mpi.h>

#include "meshflow/comm/mpi/communicator.h"
#endif

namespace meshflow::bench {

const std::vector<std::string>& collective_names() {
  static const std::vector<std::string> names = {"all_gather", "all_reduce", "reduce_scatter",
                                                 "all_to_all", "broadcast",  "collective_permute"};
  return names;
}

std::int64_t parse_bytes(std::string_view text) {
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string_view unit(ptr, text.data() + text.size() - ptr);
  std::int64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1 << 10;
  if (unit == "M" || unit == "MiB") scale = 1 << 20;
  if (unit == "G" || unit == "GiB") scale = 1 << 30;
  if (ec != std::errc() || value <= 0 || scale == 0) {
    fail(ErrorKind::kInvalidArgument, "malformed size \"{}\" (expected e.g. 4K, 16M, 1G)", text);
  }
  return value * scale;
}

double measured_memcpy_gbps() {
  constexpr std::int64_t kBytes = 64 << 20;
  return static_cast<double>(kBytes) / measure_memcpy_seconds(kBytes) / 1e9;
}

LaunchOptions bench_launch_options(Backend backend, int devices) {
  return {.backend = backend,
          .devices = devices > 0 ? first_devices(devices) : std::vector<DeviceId>{},
          .timeout = std::chrono::minutes(10)};
}

double measure_memcpy_seconds(std::int64_t bytes) {
  Tensor a = random_tensor(DType::kFloat32, {bytes / 4}, 1);
  Tensor b(DType::kFloat32, {bytes / 4});
  std::vector<double> t;
  for (int i = 0; i < 5; ++i)
    t.push_back(time_once([&] { std::memcpy(b.bytes(), a.bytes(), a.nbytes()); }));
  return median(t);
}

namespace {

constexpr DType kDtype = DType::kFloat32;
constexpr std::int64_t kElem = 4;

// One device's buffers for one case.
struct Buffers {
  Tensor send, recv;
};

// Element counts per rank for `count` elements over n ranks (the chunk rule).
std::vector<std::int64_t> chunks(std::int64_t count, int n) {
  std::vector<std::int64_t> out(n);
  const std::int64_t c = (count + n - 1) / n;
  for (int k = 0; k < n; ++k)
    out[k] = std::max<std::int64_t>(0, std::min(count, (k + 1) * c) - std::min(count, k * c));
  return out;
}

void mcopy(std::byte* dst, const std::byte* src, std::int64_t elems) {
  if (elems > 0) std::memcpy(dst, src, static_cast<std::size_t>(elems * kElem));
}

struct Spec {
  std::string algorithm;
  double bus_factor;  // bus bytes = factor * S
  Buffers (*make)(std::int64_t count, int n, int r);
  void (*run)(Communicator&, Buffers&, std::int64_t count, Completion);
  void (*floor)(int r, int n, const std::vector<Buffers*>& peers, std::int64_t count);
};

// The all_gather case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec all_gather_spec(double ring) {
  return Spec{
      "direct copy", ring,
      [](std::int64_t count, int n_, int r) {
        return Buffers{random_tensor(kDtype, {chunks(count, n_)[r]}, r), Tensor(kDtype, {count})};
      },
      [](Communicator& c, Buffers& b, std::int64_t count, Completion) {
        all_gather(c, {.send = b.send.bytes(),
                       .recv = b.recv.bytes(),
                       .recv_counts = chunks(count, c.size()),
                       .dtype = kDtype});
      },
      [](int r, int n_, const std::vector<Buffers*>& p, std::int64_t count) {
        auto cs = chunks(count, n_);
        auto d = displacements(cs);
        for (int i = 0; i < n_; ++i) {
          int k = (r + i) % n_;
          mcopy(p[r]->recv.bytes() + d[k] * kElem, p[k]->send.bytes(), cs[k]);
        }
      }};
}

// The reduce_scatter case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec reduce_scatter_spec(double ring) {
  return Spec{
      "direct reduce", ring,
      [](std::int64_t count, int n_, int r) {
        return Buffers{random_tensor(kDtype, {count}, r), Tensor(kDtype, {chunks(count, n_)[r]})};
      },
      [](Communicator& c, Buffers& b, std::int64_t count, Completion) {
        reduce_scatter(c, {.send = b.send.bytes(),
                           .recv = b.recv.bytes(),
                           .recv_counts = chunks(count, c.size()),
                           .dtype = kDtype,
                           .op = ReduceOp::kSum});
      },
      [](int r, int n_, const std::vector<Buffers*>& p, std::int64_t count) {
        auto cs = chunks(count, n_);
        auto d = displacements(cs);
        for (int k = 0; k < n_; ++k)
          mcopy(p[r]->recv.bytes(), p[k]->send.bytes() + d[r] * kElem, cs[r]);
      }};
}

// The all_reduce case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec all_reduce_spec(double ring) {
  return Spec{
      "reduce-scatter + all-gather", 2 * ring,
      [](std::int64_t count, int, int r) {
        return Buffers{random_tensor(kDtype, {count}, r), Tensor(kDtype, {count})};
      },
      [](Communicator& c, Buffers& b, std::int64_t count, Completion) {
        all_reduce(c, {.send = b.send.bytes(),
                       .recv = b.recv.bytes(),
                       .count = count,
                       .dtype = kDtype,
                       .op = ReduceOp::kSum});
      },
      [](int r, int n_, const std::vector<Buffers*>& p, std::int64_t count) {
        auto cs = chunks(count, n_);
        auto d = displacements(cs);
        for (int k = 0; k < n_; ++k)
          mcopy(p[r]->recv.bytes() + d[r] * kElem, p[k]->send.bytes() + d[r] * kElem, cs[r]);
        for (int i = 1; i < n_; ++i) {
          int k = (r + i) % n_;
          mcopy(p[r]->recv.bytes() + d[k] * kElem, p[k]->send.bytes() + d[k] * kElem, cs[k]);
        }
      }};
}

// The all_to_all case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec all_to_all_spec(double ring) {
  return Spec{"direct copy", ring,
              [](std::int64_t count, int n_, int r) {
                std::int64_t mine = chunks(count, n_)[0] / n_ * n_;
                return Buffers{random_tensor(kDtype, {mine}, r), Tensor(kDtype, {mine})};
              },
              [](Communicator& c, Buffers& b, std::int64_t, Completion) {
                std::vector<std::int64_t> per(c.size(), b.send.numel() / c.size());
                all_to_all(c, {.send = b.send.bytes(),
                               .send_counts = per,
                               .recv = b.recv.bytes(),
                               .recv_counts = per,
                               .dtype = kDtype});
              },
              [](int r, int n_, const std::vector<Buffers*>& p, std::int64_t) {
                const std::int64_t per = p[r]->send.numel() / n_;
                for (int i = 0; i < n_; ++i) {
                  int k = (r + i) % n_;
                  mcopy(p[r]->recv.bytes() + k * per * kElem, p[k]->send.bytes() + r * per * kElem,
                        per);
                }
              }};
}

// The broadcast case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec broadcast_spec() {
  return Spec{"direct copy", 1.0,
              [](std::int64_t count, int, int r) {
                return Buffers{Tensor(kDtype, {0}), random_tensor(kDtype, {count}, r)};
              },
              [](Communicator& c, Buffers& b, std::int64_t count, Completion) {
                broadcast(
                    c, {.data = b.recv.bytes(), .count = count, .dtype = kDtype, .root = Rank{0}});
              },
              [](int r, int, const std::vector<Buffers*>& p, std::int64_t count) {
                if (r != 0) mcopy(p[r]->recv.bytes(), p[0]->recv.bytes(), count);
              }};
}

// The collective_permute case: its algorithm, bus-bandwidth factor, buffers, call and floor.
Spec collective_permute_spec(int n) {
  return Spec{"direct copy", 1.0 / n,
              [](std::int64_t count, int n_, int r) {
                std::int64_t mine = chunks(count, n_)[0];
                return Buffers{random_tensor(kDtype, {mine}, r), Tensor(kDtype, {mine})};
              },
              [](Communicator& c, Buffers& b, std::int64_t, Completion) {
                collective_permute(c, {.send = b.send.bytes(),
                                       .send_count = b.send.numel(),
                                       .recv = b.recv.bytes(),
                                       .recv_count = b.recv.numel(),
                                       .dtype = kDtype,
                                       .shift = 1});
              },
              [](int r, int n_, const std::vector<Buffers*>& p, std::int64_t) {
                mcopy(p[r]->recv.bytes(), p[(r + 1) % n_]->send.bytes(), p[r]->recv.numel());
              }};
}

std::map<std::string, Spec> specs(int n) {
  const double ring = n > 1 ? double(n - 1) / n : 0;
  return {
      {"all_gather", all_gather_spec(ring)}, {"reduce_scatter", reduce_scatter_spec(ring)},
      {"all_reduce", all_reduce_spec(ring)}, {"all_to_all", all_to_all_spec(ring)},
      {"broadcast", broadcast_spec()},       {"collective_permute", collective_permute_spec(n)}};
}

#ifdef MESHFLOW_HAVE_MPI
// The same operation as the case, called on MPI directly.
void raw_mpi(const std::string& name, Communicator& comm, Buffers& b, std::int64_t count) {
  MPI_Comm h = dynamic_cast<mpi::MpiCommunicator&>(comm).handle();
  const int n = comm.size(), r = comm.rank();
  std::vector<int> cs;
  for (auto c : chunks(count, n)) cs.push_back(static_cast<int>(c));
  std::vector<int> d(n, 0);
  for (int k = 1; k < n; ++k) d[k] = d[k - 1] + cs[k - 1];
  const std::string what = "bench collectives: " + name + " by MPI";
  if (name == "all_gather")
    mpi::check(MPI_Allgatherv(b.send.bytes(), cs[r], MPI_FLOAT, b.recv.bytes(), cs.data(), d.data(),
                              MPI_FLOAT, h),
               what);
  if (name == "reduce_scatter")
    mpi::check(MPI_Reduce_scatter(b.send.bytes(), b.recv.bytes(), cs.data(), MPI_FLOAT, MPI_SUM, h),
               what);
  if (name == "all_reduce")
    mpi::check(MPI_Allreduce(b.send.bytes(), b.recv.bytes(), static_cast<int>(count), MPI_FLOAT,
                             MPI_SUM, h),
               what);
  if (name == "all_to_all") {
    std::vector<int> per(n, static_cast<int>(b.send.numel() / n)), pd(n);
    for (int k = 0; k < n; ++k) pd[k] = k * per[0];
    mpi::check(MPI_Alltoallv(b.send.bytes(), per.data(), pd.data(), MPI_FLOAT, b.recv.bytes(),
                             per.data(), pd.data(), MPI_FLOAT, h),
               what);
  }
  if (name == "broadcast")
    mpi::check(MPI_Bcast(b.recv.bytes(), static_cast<int>(count), MPI_FLOAT, 0, h), what);
  if (name == "collective_permute") {
    mpi::check(MPI_Sendrecv(b.send.bytes(), static_cast<int>(b.send.numel()), MPI_FLOAT,
                            (r + n - 1) % n, 7, b.recv.bytes(), static_cast<int>(b.recv.numel()),
                            MPI_FLOAT, (r + 1) % n, 7, h, MPI_STATUS_IGNORE),
               what);
  }
}
#endif

}  // namespace

BenchReport run_collectives_bench(const CollectivesBenchOptions& options, bool* printer) {
  std::vector<std::string> names =
      options.collectives.empty() ? collective_names() : options.collectives;
  for (const std::string& name : names) {
    if (std::find(collective_names().begin(), collective_names().end(), name) ==
        collective_names().end()) {
      fail(ErrorKind::kInvalidArgument, "unknown collective \"{}\"", name);
    }
  }
  BenchReport report{.benchmark = "collectives", .progress = options.progress};
  *printer = false;
  std::mutex report_mu;
  std::vector<Buffers*> peers;
  const bool threads = options.backend == Backend::kThreads;
  launch(bench_launch_options(options.backend, options.devices), [&](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    if (r == 0) {
      std::lock_guard lock(report_mu);
      report.memcpy_gbps = measured_memcpy_gbps();
      peers.assign(n, nullptr);
      *printer = true;
    }
    barrier(comm);
    const auto spec_table = specs(n);
    for (const std::string& name : names) {
      const Spec& spec = spec_table.at(name);
      for (std::int64_t bytes : options.sizes) {
        const std::int64_t count = bytes / kElem;
        Buffers mine = spec.make(count, n, r);
        if (threads) peers[r] = &mine;
        barrier(comm);
        BenchResult result{.case_name = name,
                           .backend = std::string(to_string(options.backend)),
                           .mesh = std::to_string(n),
                           .devices = n,
                           .bytes = count * kElem};
        auto timed = [&](const std::function<void()>& fn) {
          return time_between_barriers(comm, fn);
        };
        auto run_case = [&] { spec.run(comm, mine, count, Completion::kWait); };
        std::function<void()> other;
        if (threads) {
          other = [&] { spec.floor(r, n, peers, count); };
        } else {
#ifdef MESHFLOW_HAVE_MPI
          other = [&] { raw_mpi(name, comm, mine, count); };
#endif
        }
        for (int i = 0; i < options.warmup; ++i) {
          timed(run_case);
          timed(other);
        }
        for (int i = 0; i < options.reps; ++i) {
          result.case_s.push_back(timed(run_case));
          (threads ? result.floor_s : result.baseline_s).push_back(timed(other));
        }
        if (!threads) result.baseline = "mpi";
        result.extra["algorithm"] = threads ? spec.algorithm : "MPI library";
        result.extra["busbw_gbps"] = spec.bus_factor * result.bytes / median(result.case_s) / 1e9;
        barrier(comm);
        if (r == 0) {
          std::lock_guard lock(report_mu);
          add_result(report, std::move(result));
        }
      }
    }
  });
  return report;
}

}  // namespace meshflow::bench
