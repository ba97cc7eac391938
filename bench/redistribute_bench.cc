// Redistribution benchmark. The tensor is (rows, 1024) float32 on mesh (n); device r of n holds
// rows chunk r under S(0), columns chunk r under S(1), and a full term under P(sum). Floors,
// per device r (blocks by the chunk rule):
//   S(0)->R       memcpy of every device's row block into r's output (the all-gather pattern)
//   S(0)->S(1)    for every device k, as many bytes as k's rows restricted to r's columns hold,
//                 copied as one contiguous run of k's input into r's output (the contiguous
//                 ideal: the same bytes with no stride)
//   P(sum)->S(0)  memcpy of r's row block from every device's term (one read of every term)
//   P(sum)->R     the bandwidth-optimal all-reduce pattern: P(sum)->S(0)'s reads, then every
//                 other device's block into r's output (read from its input, so that the floor,
//                 which has no synchronisation, has no data race either)
// Under mpi each case is also timed against the raw MPI collective doing its work (the baseline),
// which replaces the memcpy floor; S(0)->S(1)'s floor there is its contiguous ideal in MPI.
#include "bench/redistribute_bench.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "bench/collectives_bench.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/runtime/executor.h"
#ifdef MESHFLOW_HAVE_MPI
#include <mpi.h>

#include "meshflow/comm/mpi/communicator.h"
#endif

namespace meshflow::bench {

const std::vector<std::string>& redistribute_case_names() {
  static const std::vector<std::string> names = {"S(0)->R", "S(0)->S(1)", "P(sum)->S(0)",
                                                 "P(sum)->R"};
  return names;
}

namespace {

constexpr std::int64_t kCols = 1024;
constexpr std::size_t kElem = 4;

struct DeviceBuffers {
  Tensor in, out;
};

void floor_pattern(const std::string& name, const Layout& from, const Layout& to, int r,
                   const std::vector<DeviceBuffers*>& peers) {
  const int n = static_cast<int>(peers.size());
  const Box mine = shard_box(to, r);
  std::byte* out = peers[r]->out.bytes();
  const std::size_t row = kCols * kElem;
  if (name == "S(0)->R") {
    for (int i = 0; i < n; ++i) {
      const int k = (r + i) % n;
      std::memcpy(out + shard_box(from, k).offset[0] * row, peers[k]->in.bytes(),
                  peers[k]->in.nbytes());
    }
  } else if (name == "S(0)->S(1)") {
    // The contiguous ideal: r's block from k (k's rows, r's columns) as one run of k's input.
    const std::size_t out_row = mine.extent[1] * kElem;
    for (int i = 0; i < n; ++i) {
      const int k = (r + i) % n;
      const Box b = shard_box(from, k);
      const std::size_t bytes = b.extent[0] * out_row;
      std::memcpy(out + b.offset[0] * out_row, peers[k]->in.bytes() + r * bytes, bytes);
    }
  } else if (name == "P(sum)->S(0)") {
    for (int i = 0; i < n; ++i) {
      const int k = (r + i) % n;
      std::memcpy(out, peers[k]->in.bytes() + mine.offset[0] * row, peers[r]->out.nbytes());
    }
  } else {  // P(sum)->R
    const Layout rows = make_layout(from.mesh, {Placement::shard(0)}, from.shape, from.dtype);
    const Box own = shard_box(rows, r);
    for (int i = 0; i < n; ++i) {
      const int k = (r + i) % n;
      std::memcpy(out + own.offset[0] * row, peers[k]->in.bytes() + own.offset[0] * row,
                  own.extent[0] * row);
    }
    for (int i = 1; i < n; ++i) {
      const int k = (r + i) % n;
      const Box b = shard_box(rows, k);
      std::memcpy(out + b.offset[0] * row, peers[k]->in.bytes() + b.offset[0] * row,
                  b.extent[0] * row);
    }
  }
}

#ifdef MESHFLOW_HAVE_MPI
// The raw MPI collective doing case `name`, the baseline "mpi": the same elements from the same
// places to the same places. S(0)->R is an MPI_Allgatherv of the row blocks, S(0)->S(1) an
// MPI_Alltoallw whose send types pick each receiver's columns out of the rows, P(sum)->S(0) an
// MPI_Reduce_scatter and P(sum)->R an MPI_Allreduce.
void raw_mpi(const std::string& name, Communicator& comm, const Layout& from, const Layout& to,
             DeviceBuffers& b) {
  MPI_Comm h = dynamic_cast<mpi::MpiCommunicator&>(comm).handle();
  auto row_counts = [&](const Layout& l) {
    std::vector<int> c;
    for (DeviceId d : l.mesh.devices) c.push_back(static_cast<int>(numel(local_shape(l, d))));
    return c;
  };
  auto displs = [](const std::vector<int>& c) {
    std::vector<int> d(c.size(), 0);
    for (std::size_t k = 1; k < c.size(); ++k) d[k] = d[k - 1] + c[k - 1];
    return d;
  };
  if (name == "S(0)->R") {
    const auto c = row_counts(from);
    mpi::check(MPI_Allgatherv(b.in.bytes(), c[comm.rank()], MPI_FLOAT, b.out.bytes(), c.data(),
                              displs(c).data(), MPI_FLOAT, h),
               "bench redistribute: MPI_Allgatherv");
  } else if (name == "S(0)->S(1)") {
    // To device k: my rows restricted to k's columns (a vector type at k's first column); from
    // device k: k's rows of my columns, one contiguous run of my output.
    const int n = comm.size();
    const Box mine = shard_box(to, comm.rank());
    std::vector<int> send_counts(n, 1), send_displs(n), recv_counts(n), recv_displs(n);
    std::vector<MPI_Datatype> send_types(n), recv_types(n, MPI_FLOAT);
    for (int k = 0; k < n; ++k) {
      const Box cols = shard_box(to, k), rows = shard_box(from, k);
      MPI_Type_vector(static_cast<int>(b.in.shape()[0]), static_cast<int>(cols.extent[1]),
                      static_cast<int>(kCols), MPI_FLOAT, &send_types[k]);
      MPI_Type_commit(&send_types[k]);
      send_displs[k] = static_cast<int>(cols.offset[1] * kElem);
      recv_counts[k] = static_cast<int>(rows.extent[0] * mine.extent[1]);
      recv_displs[k] = static_cast<int>(rows.offset[0] * mine.extent[1] * kElem);
    }
    mpi::check(
        MPI_Alltoallw(b.in.bytes(), send_counts.data(), send_displs.data(), send_types.data(),
                      b.out.bytes(), recv_counts.data(), recv_displs.data(), recv_types.data(), h),
        "bench redistribute: MPI_Alltoallw");
    for (MPI_Datatype& t : send_types) MPI_Type_free(&t);
  } else if (name == "P(sum)->S(0)") {
    const auto c = row_counts(to);
    mpi::check(MPI_Reduce_scatter(b.in.bytes(), b.out.bytes(), c.data(), MPI_FLOAT, MPI_SUM, h),
               "bench redistribute: MPI_Reduce_scatter");
  } else {
    mpi::check(MPI_Allreduce(b.in.bytes(), b.out.bytes(), static_cast<int>(b.in.numel()), MPI_FLOAT,
                             MPI_SUM, h),
               "bench redistribute: MPI_Allreduce");
  }
}

// The contiguous ideal of S(0)->S(1) under MPI (its floor): an MPI_Alltoall of as many bytes in
// equal contiguous blocks, which moves the same amount from the same buffers without the stride
// (and so does not redistribute). Its block is the same on every rank, as MPI_Alltoall requires:
// the smallest shard's n-th part.
void contiguous_alltoall(Communicator& comm, const Layout& from, const Layout& to,
                         DeviceBuffers& b) {
  MPI_Comm h = dynamic_cast<mpi::MpiCommunicator&>(comm).handle();
  std::int64_t smallest = b.in.numel();
  for (DeviceId d : from.mesh.devices) {
    smallest = std::min({smallest, numel(local_shape(from, d)), numel(local_shape(to, d))});
  }
  const int per = static_cast<int>(smallest / comm.size());
  mpi::check(MPI_Alltoall(b.in.bytes(), per, MPI_FLOAT, b.out.bytes(), per, MPI_FLOAT, h),
             "bench redistribute: MPI_Alltoall");
}

// Runs the case and its baseline once each and fails on every rank unless both leave the same
// output (bit for bit where the case only moves data, within float32 rounding where it sums), so
// that the baseline is known to do the case's work.
void check_same_result(const std::string& name, Communicator& comm,
                       const std::function<void()>& run_case, const std::function<void()>& baseline,
                       DeviceBuffers& b) {
  run_case();
  const Tensor ours = b.out.clone();
  baseline();
  const bool sums = name.starts_with("P(");
  const std::optional<std::string> diff =
      sums ? compare_close(b.out, ours, 1e-5, 1e-5) : compare_exact(b.out, ours);
  int bad = diff ? 1 : 0, any = 0;
  mpi::check(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX,
                           dynamic_cast<mpi::MpiCommunicator&>(comm).handle()),
             "bench redistribute: MPI_Allreduce");
  if (any != 0) {
    fail(ErrorKind::kInternal, "bench redistribute: the raw MPI baseline of {} differs from {}",
         name, diff ? "meshflow's result: " + *diff : "meshflow's result on another rank");
  }
}
#endif

std::pair<std::string, std::string> split_case(const std::string& name) {
  const std::size_t arrow = name.find("->");
  return {name.substr(0, arrow), name.substr(arrow + 2)};
}

// Returns the median seconds of `reps` calls of fn, each timed alone.
double median_of(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(time_once(fn));
  return median(t);
}

void add_planning_rows(BenchReport& report, int reps) {
  // A cached plan: the lookup a training step pays every time.
  PlanCache cache;
  const Layout a =
      make_layout(make_mesh({2, 2, 2}), parse_placements("P(sum),R,S(0)"), {64, 64, 64});
  const Layout b = make_layout(make_mesh({2, 2, 2}), parse_placements("R,S(1),S(0)"), {64, 64, 64});
  cache.get(a, b);
  constexpr int kLookups = 10000;
  BenchResult cached{
      .case_name = "plan cached (2x2x2)", .backend = "none", .mesh = "2x2x2", .devices = 8};
  for (int i = 0; i < reps; ++i) {
    cached.case_s.push_back(time_once([&] {
                              for (int j = 0; j < kLookups; ++j) cache.get(a, b);
                            }) /
                            kLookups);
  }
  cached.extra["target_s"] = 2e-6;
  add_result(report, cached);
  BenchResult fresh{
      .case_name = "plan fresh (2x2x2)", .backend = "none", .mesh = "2x2x2", .devices = 8};
  fresh.case_s.push_back(median_of(reps, [&] { plan_redistribute(a, b); }));
  fresh.extra["target_s"] = 1e-3;
  add_result(report, fresh);
  const Layout c =
      make_layout(make_mesh({16, 16, 16}), parse_placements("S(0),P(sum),S(1)"), {4096, 4096});
  const Layout d =
      make_layout(make_mesh({16, 16, 16}), parse_placements("R,S(1),S(0)"), {4096, 4096});
  BenchResult big{
      .case_name = "plan fresh (16x16x16)", .backend = "none", .mesh = "16x16x16", .devices = 4096};
  big.case_s.push_back(median_of(reps, [&] { plan_redistribute(c, d); }));
  big.extra["target_s"] = 50e-3;
  add_result(report, big);
}

}  // namespace

BenchReport run_redistribute_bench(const RedistributeBenchOptions& options, bool* printer) {
  std::vector<std::string> names =
      options.cases.empty() ? redistribute_case_names() : options.cases;
  for (const std::string& name : names) {
    if (std::find(redistribute_case_names().begin(), redistribute_case_names().end(), name) ==
        redistribute_case_names().end()) {
      fail(ErrorKind::kInvalidArgument,
           "unknown case \"{}\" (expected S(0)->R, S(0)->S(1), P(sum)->S(0) or P(sum)->R)", name);
    }
  }
  BenchReport report{.benchmark = "redistribute", .progress = options.progress};
  *printer = false;
  std::mutex mu;
  std::vector<DeviceBuffers*> peers;
  const bool threads = options.backend == Backend::kThreads;
  PlanCache cache;
  launch(bench_launch_options(options.backend, options.devices), [&](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    if (r == 0) {
      std::lock_guard lock(mu);
      report.memcpy_gbps = measured_memcpy_gbps();
      peers.assign(n, nullptr);
      *printer = true;
    }
    barrier(comm);
    const DeviceMesh mesh = make_mesh({n});
    for (const std::string& name : names) {
      for (std::int64_t bytes : options.sizes) {
        const Shape shape{
            std::max<std::int64_t>(1, bytes / static_cast<std::int64_t>(kElem) / kCols), kCols};
        const auto [from_text, to_text_] = split_case(name);
        const Layout from = make_layout(mesh, parse_placements(from_text), shape);
        const Layout to = make_layout(mesh, parse_placements(to_text_), shape);
        std::shared_ptr<const Plan> plan = cache.get(from, to);
        std::shared_ptr<const DeviceProgram> program = cache.program(from, to, comm.device());
        DeviceBuffers mine{random_tensor(DType::kFloat32, local_shape(from, r), r + 1),
                           Tensor(DType::kFloat32, local_shape(to, r))};
        if (threads) peers[r] = &mine;
        barrier(comm);
        BenchResult result{.case_name = name,
                           .backend = std::string(to_string(options.backend)),
                           .mesh = to_string(mesh),
                           .devices = n,
                           .bytes = numel(shape) * static_cast<std::int64_t>(kElem)};
        auto timed = [&](const std::function<void()>& fn) {
          return time_between_barriers(comm, fn);
        };
        auto run_case = [&] { mine.out = execute(*program, comm, mine.in, std::move(mine.out)); };
        // threads: the memcpy floor. mpi: the raw MPI collective of the same work as the
        // baseline, and where that strides (S(0)->S(1)) its contiguous ideal as the floor.
        std::function<void()> floor = [&] { floor_pattern(name, from, to, r, peers); };
        std::function<void()> baseline;
#ifdef MESHFLOW_HAVE_MPI
        if (!threads) {
          baseline = [&] { raw_mpi(name, comm, from, to, mine); };
          result.baseline = "mpi";
          floor = nullptr;
          if (name == "S(0)->S(1)") floor = [&] { contiguous_alltoall(comm, from, to, mine); };
          check_same_result(name, comm, run_case, baseline, mine);
        }
#endif
        for (int i = 0; i < options.warmup; ++i) {
          timed(run_case);
          if (floor) timed(floor);
          if (baseline) timed(baseline);
        }
        for (int i = 0; i < options.reps; ++i) {
          result.case_s.push_back(timed(run_case));
          if (floor) result.floor_s.push_back(timed(floor));
          if (baseline) result.baseline_s.push_back(timed(baseline));
        }
        std::string steps;
        for (const Step& s : plan->steps)
          steps += (steps.empty() ? "" : "+") + std::string(meshflow::to_string(s.kind));
        result.extra["plan"] = plan->planner + ": " + steps;
        barrier(comm);
        if (r == 0) {
          std::lock_guard lock(mu);
          add_result(report, std::move(result));
        }
      }
    }
  });
  if (*printer) add_planning_rows(report, options.reps);
  return report;
}

}  // namespace meshflow::bench
