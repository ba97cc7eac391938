// The overlap benchmark: every form and size, its sequential baseline and the collective and the
// GEMM alone, interleaved rep by rep.
#include "bench/overlap_bench.h"

#include <algorithm>
#include <mutex>

#include "bench/collectives_bench.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/matmul.h"
#include "meshflow/runtime/overlap.h"

namespace meshflow::bench {

namespace {

constexpr std::int64_t kWidth = 512;  // K and N

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names = {
      "allgather_gemm_permute", "allgather_gemm_broadcast", "allgather_gemm_in_place",
      "gemm_reduce_scatter", "gemm_reduce_scatter_in_place"};
  return names;
}

bool is_scatter(const std::string& name) { return name.starts_with("gemm_reduce_scatter"); }

// The form of a case's loop (a reduce-scatter's permute form is the ring).
GatherForm form_of(const std::string& name) {
  if (name == "allgather_gemm_broadcast") return GatherForm::kBroadcast;
  if (name.ends_with("_in_place")) return GatherForm::kInPlace;
  return GatherForm::kPermute;
}

// The in-place cases run only where devices share memory.
bool runs_on(const std::string& name, bool shared_memory) {
  return shared_memory || form_of(name) != GatherForm::kInPlace;
}

void gemm_into(const Tensor& a, const Tensor& b, Tensor& c) {
  gemm<float>(false, false, a.shape()[0], b.shape()[1], a.shape()[1], a.data<float>().data(),
              a.shape()[1], b.data<float>().data(), b.shape()[1], 0.0f, c.data<float>().data(),
              b.shape()[1]);
}

// Times of one case on this device's communicator, rep by rep.
struct Samples {
  std::vector<double> overlapped, sequential, comm, gemm;
};

// Times the decomposed form, the sequential one, and its collective and GEMM alone, rep by rep
// and interleaved, after one untimed rep.
Samples sample(Communicator& comm, int reps, const std::function<void()>& overlapped,
               const std::function<void()>& sequential, const std::function<void()>& collective,
               const std::function<void()>& gemm) {
  Samples s;
  auto timed = [&](const std::function<void()>& fn) { return time_between_barriers(comm, fn); };
  for (int rep = -1; rep < reps; ++rep) {
    const double ov = timed(overlapped);
    const double seq = timed(sequential);
    const double c = timed(collective);
    const double g = timed(gemm);
    if (rep < 0) continue;
    s.overlapped.push_back(ov);
    s.sequential.push_back(seq);
    s.comm.push_back(c);
    s.gemm.push_back(g);
  }
  return s;
}

Samples run_case(Communicator& comm, const std::string& name, std::int64_t rows, int reps) {
  const int n = comm.size(), r = comm.rank();
  std::vector<std::int64_t> counts;
  for (int i = 0; i < n; ++i) counts.push_back(chunk(rows, n, i).extent * kWidth);
  const GatherForm form = form_of(name);
  if (!is_scatter(name)) {
    const Tensor x = random_tensor(DType::kFloat32, {chunk(rows, n, r).extent, kWidth}, 1 + r);
    const Tensor w = random_tensor(DType::kFloat32, {kWidth, kWidth}, 99);
    const Tensor* rest[] = {&w};
    Tensor full = Tensor::uninitialized(DType::kFloat32, {rows, kWidth});
    Tensor y = Tensor::uninitialized(DType::kFloat32, {rows, kWidth});
    auto gather = [&] {
      all_gather(comm, {.send = x.bytes(), .recv = full.bytes(), .recv_counts = counts});
    };
    auto multiply = [&] { gemm_into(full, w, y); };
    return sample(
        comm, reps,
        [&] {
          allgather_product(comm, Op{.type = OpType::kMatmul}, x, rows, rest, {.form = form});
        },
        [&] {
          gather();
          multiply();
        },
        gather, multiply);
  }
  const Chunk kc = chunk(kWidth, n, r);
  const Tensor x = random_tensor(DType::kFloat32, {rows, kc.extent}, 1 + r);
  const Tensor w = random_tensor(DType::kFloat32, {kc.extent, kWidth}, 50 + r);
  const Tensor* rest[] = {&w};
  Tensor partial = Tensor::uninitialized(DType::kFloat32, {rows, kWidth});
  Tensor y = Tensor::uninitialized(DType::kFloat32, {chunk(rows, n, r).extent, kWidth});
  auto scatter = [&] {
    reduce_scatter(comm, {.send = partial.bytes(), .recv = y.bytes(), .recv_counts = counts});
  };
  auto multiply = [&] { gemm_into(x, w, partial); };
  return sample(
      comm, reps,
      [&] { product_reduce_scatter(comm, Op{.type = OpType::kMatmul}, x, rest, {.form = form}); },
      [&] {
        multiply();
        scatter();
      },
      scatter, multiply);
}

// The cost model's view of one case on n devices: x's rows in chunk-rule blocks, w packed by
// every product call.
OverlapCostInput cost_input(const std::string& name, std::int64_t rows, int n) {
  const bool gather = !is_scatter(name);
  // The reduce-scatter case multiplies every row by this device's K block (the largest).
  const std::int64_t k = gather ? kWidth : chunk(kWidth, n, 0).extent;
  OverlapCostInput in{.mesh_dim = 0, .call_bytes = k * kWidth * 4};
  for (int b = 0; b < n; ++b) {
    const std::int64_t r = chunk(rows, n, b).extent;
    in.block_bytes.push_back(r * kWidth * 4);
    in.block_flops.push_back(2.0 * static_cast<double>(r * k * kWidth));
  }
  return in;
}

OverlapEstimate estimate(const MachineModel& machine, const std::string& name, std::int64_t rows,
                         int n) {
  const OverlapCostInput in = cost_input(name, rows, n);
  return is_scatter(name) ? reduce_scatter_overlap(machine, in, form_of(name))
                          : gather_overlap(machine, in, form_of(name));
}

// What `--overlap` does with this case's collective on the built-in machine (the cost model
// deciding where and how): the form it picks, or "whole" where no loop is shorter.
std::string overlap_choice(const std::string& name, std::int64_t rows, int n, bool shared_memory) {
  const LoopChoice loop =
      choose_loop(default_machine(), cost_input(name, rows, n), !is_scatter(name), shared_memory);
  if (!loop.pays) return "whole";
  if (is_scatter(name) && loop.form == GatherForm::kPermute) return "ring";
  return std::string(to_string(loop.form));
}

// The cost model's timeline of one case on n devices of `machine`, its links taken to run
// beside compute (what a cluster's NICs do).
BenchResult simulate_case(MachineModel machine, const std::string& name, std::int64_t rows, int n) {
  for (auto& [link_name, link] : machine.links) link.copies_on_cores = false;
  const OverlapEstimate e = estimate(machine, name, rows, n);
  BenchResult r{.case_name = name,
                .backend = "simulated",
                .mesh = std::to_string(n),
                .devices = n,
                .bytes = rows * kWidth * 4,
                .case_s = {e.overlapped_s},
                .baseline = "sequential",
                .baseline_s = {e.sequential_s}};
  r.extra["comm_s"] = e.comm_s;
  r.extra["gemm_s"] = e.product_s;
  const double room = std::min(e.comm_s, e.product_s);
  r.extra["overlap_efficiency"] = room > 0 ? (e.sequential_s - e.overlapped_s) / room : 0.0;
  r.extra["shape"] = fmt::format("x [{}, {}] @ w [{}, {}]", rows, kWidth, kWidth, kWidth);
  return r;
}

}  // namespace

BenchReport run_overlap_bench(const OverlapBenchOptions& options, bool* printer) {
  // Simulated devices and mpi processes do not share memory; threads do.
  const bool shared_memory = !options.simulate && options.backend == Backend::kThreads;
  std::vector<std::string> names;
  for (const std::string& name : case_names()) {
    if (runs_on(name, shared_memory)) names.push_back(name);
  }
  if (!options.cases.empty()) names = options.cases;
  for (const std::string& name : names) {
    if (std::find(case_names().begin(), case_names().end(), name) == case_names().end())
      fail(ErrorKind::kInvalidArgument, "unknown case \"{}\"", name);
    if (!runs_on(name, shared_memory)) {
      fail(ErrorKind::kInvalidArgument,
           "case \"{}\" reads peers' blocks in place and needs devices that share memory (the "
           "threads backend)",
           name);
    }
  }
  BenchReport report{.benchmark = "overlap", .progress = options.progress};
  if (options.simulate) {
    *printer = true;
    report.memcpy_gbps = options.simulate->memcpy_gbps;
    const int n = options.devices > 0 ? options.devices : 4;
    for (const std::string& name : names) {
      for (std::int64_t bytes : options.sizes) {
        const std::int64_t rows = std::max<std::int64_t>(1, bytes / 4 / kWidth);
        add_result(report, simulate_case(*options.simulate, name, rows, n));
      }
    }
    return report;
  }
  *printer = false;
  std::mutex mu;
  launch(bench_launch_options(options.backend, options.devices), [&](Communicator& comm) {
    const int n = comm.size();
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      report.memcpy_gbps = measured_memcpy_gbps();
      *printer = true;
    }
    for (const std::string& name : names) {
      for (std::int64_t bytes : options.sizes) {
        const std::int64_t rows = std::max<std::int64_t>(1, bytes / 4 / kWidth);
        Samples s = run_case(comm, name, rows, options.reps);
        if (comm.rank() != 0) continue;
        BenchResult result{.case_name = name,
                           .backend = std::string(to_string(options.backend)),
                           .mesh = std::to_string(n),
                           .devices = n,
                           .bytes = rows * kWidth * 4,
                           .case_s = s.overlapped,
                           .baseline = "sequential",
                           .baseline_s = s.sequential};
        const double t_comm = median(s.comm), t_gemm = median(s.gemm);
        result.extra["comm_s"] = t_comm;
        result.extra["gemm_s"] = t_gemm;
        const double room = std::min(t_comm, t_gemm);
        result.extra["overlap_efficiency"] =
            room > 0 ? (median(s.sequential) - median(s.overlapped)) / room : 0.0;
        result.extra["shape"] =
            fmt::format("x [{}, {}] @ w [{}, {}]", rows, kWidth, kWidth, kWidth);
        result.extra["overlap_choice"] = overlap_choice(name, rows, n, shared_memory);
        std::lock_guard lock(mu);
        add_result(report, std::move(result));
      }
    }
  });
  return report;
}

}  // namespace meshflow::bench
