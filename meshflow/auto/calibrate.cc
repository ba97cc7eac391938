// The measurements and the fits of calibrate.h.
#include "meshflow/auto/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/launch.h"
#include "meshflow/comm/session.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/kernels/layer_norm.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/op.h"
#include "meshflow/plan/plan.h"

namespace meshflow {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Returns each of fns' median span, run by every device at once after one untimed run, the
// functions taking turns (one timed run of each per round): a second in which the machine is slow
// then costs every function one sample out of `reps`, not one function all of them, and the fits
// see no probe skewed alone.
std::vector<double> timed_in_turn(Communicator& comm, int reps,
                                  const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) time_between_barriers(comm, fn);
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < fns.size(); ++i)
      t[i].push_back(time_between_barriers(comm, fns[i]));
  std::vector<double> out;
  for (std::vector<double>& v : t) out.push_back(median(std::move(v)));
  return out;
}

// Returns the median span of fn run by every device at once (after one untimed run).
double timed(Communicator& comm, int reps, const std::function<void()>& fn) {
  return timed_in_turn(comm, reps, {fn})[0];
}

// One operator run on one device's own operands: what the cost model prices by its points (its
// multiply-adds or elementwise steps) and bytes (operands and result), as graph/step_time.cc
// prices a task.
struct KernelProbe {
  std::string name;
  Op op;
  std::vector<Tensor> inputs;
  bool product = false;  // priced mostly by its points: fits the GEMM rate
};

Tensor random(const Shape& shape, std::uint64_t seed) {
  return random_tensor(DType::kFloat32, shape, seed);
}

Tensor labels(std::int64_t rows, std::int64_t classes) {
  Tensor t(DType::kInt64, {rows});
  for (std::int64_t i = 0; i < rows; ++i)
    t.data<std::int64_t>()[static_cast<std::size_t>(i)] = (i * 7919) % classes;
  return t;
}

// A transformer block's operators at the sizes of one device's share of a small GPT (512
// tokens, width 512, 8 heads, vocabulary 8192): large enough to run at their steady rates, small
// enough that 4 devices on 2 cores measure them all in a few seconds.
std::vector<KernelProbe> kernel_probes() {
  constexpr std::int64_t t = 512, d = 512, h = 4 * d, v = 8192;
  std::vector<KernelProbe> p;
  std::uint64_t seed = 1;
  // Adds a probe of `op` on random float32 operands of `shapes`, then the `extra` operands.
  auto add = [&](std::string name, Op op, const std::vector<Shape>& shapes, bool product,
                 std::vector<Tensor> extra = {}) {
    KernelProbe k{std::move(name), std::move(op), {}, product};
    for (const Shape& s : shapes) k.inputs.push_back(random(s, seed++));
    for (Tensor& e : extra) k.inputs.push_back(std::move(e));
    p.push_back(std::move(k));
  };
  // The products in about the shares of a GPT step's: attention's projections, the MLP, the LM
  // head (the largest) and its two gradients, attention and its three.
  add("matmul [512, 512] x [512, 1536]", Op{.type = OpType::kMatmul}, {{t, d}, {d, 3 * d}}, true);
  add("matmul [512, 512] x [512, 2048]", Op{.type = OpType::kMatmul}, {{t, d}, {d, h}}, true);
  add("linear [512, 2048] x [2048, 512] + b", Op{.type = OpType::kLinear}, {{t, h}, {h, d}, {d}},
      true);
  add("matmul [512, 512] x [512, 8192]", Op{.type = OpType::kMatmul}, {{t, d}, {d, v}}, true);
  add("matmul_grad_a [512, 8192] x [512, 8192]^T", Op{.type = OpType::kMatmulGradA},
      {{t, v}, {d, v}}, true);
  add("matmul_grad_b [512, 512]^T x [512, 8192]", Op{.type = OpType::kMatmulGradB},
      {{t, d}, {t, v}}, true);
  const Shape heads{2, 8, 256, 64};
  add("attention (causal) [2, 8, 256, 64]", Op{.type = OpType::kAttention, .causal = true},
      {heads, heads, heads}, true);
  for (OpType grad : {OpType::kAttentionGradQ, OpType::kAttentionGradK, OpType::kAttentionGradV})
    add(std::string(to_string(grad)), Op{.type = grad, .causal = true},
        {heads, heads, heads, heads}, true);
  // The memory-bound kernels of a block and the loss.
  add("gelu [512, 2048]", Op{.type = OpType::kGelu}, {{t, h}}, false);
  add("gelu_grad", Op{.type = OpType::kGeluGrad}, {{t, h}, {t, h}}, false);
  add("layer_norm [512, 512]", Op{.type = OpType::kLayerNorm}, {{t, d}, {d}, {d}}, false);
  add("layer_norm_grad_x", Op{.type = OpType::kLayerNormGradX},
      {{t, d}, {t, d}, {d}, {t, kNormStatsFloats}}, false);
  std::vector<Tensor> loss_extra;
  loss_extra.push_back(labels(256, v));
  add("softmax_cross_entropy [256, 8192]", Op{.type = OpType::kSoftmaxCrossEntropy}, {{256, v}},
      false, std::move(loss_extra));
  std::vector<Tensor> grad_extra;
  grad_extra.push_back(labels(256, v));
  grad_extra.push_back(random({}, seed++));
  add("softmax_cross_entropy_grad", Op{.type = OpType::kSoftmaxCrossEntropyGrad}, {{256, v}}, false,
      std::move(grad_extra));
  add("add [2, 256, 512]", Op{.type = OpType::kAdd}, {{2, 256, d}, {2, 256, d}}, false);
  add("transpose [2, 256, 8, 64] -> [2, 8, 256, 64]",
      Op{.type = OpType::kTranspose, .dims = {0, 2, 1, 3}}, {{2, 256, 8, 64}}, false);
  return p;
}

// Solves the 3 x 3 system m x = r (Gaussian elimination, partial pivoting) for the unknowns
// `free` marks; the others stay 0.
std::array<double, 3> solve3(std::array<std::array<double, 3>, 3> m, std::array<double, 3> r,
                             const std::array<bool, 3>& free) {
  for (int i = 0; i < 3; ++i) {
    if (free[static_cast<std::size_t>(i)]) continue;
    for (int j = 0; j < 3; ++j) m[i][j] = m[j][i] = i == j ? 1 : 0;
    r[static_cast<std::size_t>(i)] = 0;
  }
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int i = c + 1; i < 3; ++i)
      if (std::abs(m[i][c]) > std::abs(m[p][c])) p = i;
    std::swap(m[c], m[p]);
    std::swap(r[c], r[p]);
    if (std::abs(m[c][c]) < 1e-300) continue;
    for (int i = c + 1; i < 3; ++i) {
      const double f = m[i][c] / m[c][c];
      for (int j = c; j < 3; ++j) m[i][j] -= f * m[c][j];
      r[i] -= f * r[c];
    }
  }
  std::array<double, 3> x{};
  for (int c = 2; c >= 0; --c) {
    double s = r[c];
    for (int j = c + 1; j < 3; ++j) s -= m[c][j] * x[j];
    x[c] = std::abs(m[c][c]) < 1e-300 ? 0 : s / m[c][c];
  }
  return x;
}

std::string gbps(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

}  // namespace

std::pair<double, double> fit_kernel_rates(const std::vector<KernelTime>& k) {
  double pt = 0, px = 0, py = 0, et = 0, ex = 0, ey = 0;
  for (const KernelTime& m : k) {
    (m.product ? pt : et) += m.t;
    (m.product ? px : ex) += m.x;
    (m.product ? py : ey) += m.y;
  }
  MESHFLOW_CHECK(px > 0 && ey > 0, "calibrate: no product or no memory-bound kernel measured");
  double a = 0, b = 0;
  for (int round = 0; round < 8; ++round) {
    b = std::max((et - a * ex) / ey, 0.01 * et / ey);
    a = std::max((pt - b * py) / px, 0.01 * pt / px);
  }
  return {1 / a, 1 / b};
}

std::array<double, 3> fit_link(const std::vector<CollectiveTime>& c) {
  std::array<bool, 3> free{true, true, true};
  std::array<double, 3> x{};
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::array<std::array<double, 3>, 3> m{};
    std::array<double, 3> r{};
    for (const CollectiveTime& k : c) {
      const double w = 1 / k.t;  // relative error
      const std::array<double, 3> row{w, k.rounds * w, k.received * w};
      const double rhs = std::max(0.0, k.t - k.memory) * w;
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 3; ++j) m[i][j] += row[i] * row[j];
        r[i] += row[i] * rhs;
      }
    }
    x = solve3(m, r, free);
    bool negative = false;
    for (std::size_t i = 0; i < 3; ++i) {
      if (free[i] && x[i] < 0) {
        free[i] = false;
        negative = true;
      }
    }
    if (!negative) break;
  }
  for (double& v : x) v = std::max(v, 0.0);
  return x;
}

MachineModel median_machine(const std::vector<MachineModel>& machines) {
  auto median_of = [&](auto field) {
    std::vector<double> v;
    for (const MachineModel& m : machines) v.push_back(field(m));
    return median(std::move(v));
  };
  MachineModel out = machines.at(0);
  out.memcpy_gbps = median_of([](const MachineModel& m) { return m.memcpy_gbps; });
  out.gemm_gflops = median_of([](const MachineModel& m) { return m.gemm_gflops; });
  out.elementwise_gbps = median_of([](const MachineModel& m) { return m.elementwise_gbps; });
  out.collective_overhead_us =
      median_of([](const MachineModel& m) { return m.collective_overhead_us; });
  out.collective_sync_us = median_of([](const MachineModel& m) { return m.collective_sync_us; });
  out.device_handoff_us = median_of([](const MachineModel& m) { return m.device_handoff_us; });
  for (auto& [name, link] : out.links) {
    link.bandwidth_gbps =
        median_of([&](const MachineModel& m) { return m.links.at(name).bandwidth_gbps; });
    link.latency_us = median_of([&](const MachineModel& m) { return m.links.at(name).latency_us; });
  }
  return out;
}

MachineModel calibrate(const CalibrateOptions& options) {
  MESHFLOW_CHECK(options.reps >= 1, "calibrate: reps {}", options.reps);
  MachineModel machine = default_machine();
  // The cores the devices share: this process's (threads), the machine's (mpi: a process may
  // be bound to one core, but its peers compute on the others).
  machine.cores = options.backend == Backend::kThreads
                      ? available_cores()
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  LaunchOptions launch_options{.backend = options.backend};
  if (options.backend == Backend::kThreads || options.devices > 0)
    launch_options.devices = first_devices(options.devices);

  // Handing an empty job to the device threads: the threads backend's global view.
  if (options.backend == Backend::kThreads) {
    Session session(Backend::kThreads);
    const std::vector<DeviceId> devices = first_devices(options.devices);
    session.run(devices, [](Communicator&) {});
    std::vector<double> t;
    for (int r = 0; r < std::max(options.reps, 5); ++r) {
      const auto start = std::chrono::steady_clock::now();
      session.run(devices, [](Communicator&) {});
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    machine.device_handoff_us = median(t) * 1e6;
    if (options.progress) {
      options.progress(fmt::format("device hand-off: {:.1f} us ({} device threads)",
                                   machine.device_handoff_us, options.devices));
    }
  }

  std::vector<MachineModel> result(1);
  launch(launch_options, [&](Communicator& comm) {
    const int n = comm.size();
    const bool says = comm.rank() == 0 && static_cast<bool>(options.progress);
    auto say = [&](const std::string& line) {
      if (says) options.progress(line);
    };
    MachineModel m = machine;
    const std::string link_name =
        options.backend == Backend::kThreads ? std::string("shared_memory") : std::string("mpi");
    const int threads = options.threads_per_device > 0 ? options.threads_per_device
                                                       : std::max(1, available_cores() / n);
    ThreadTeam team(threads);
    const UseTeam use(&team);
    const std::string at_once =
        fmt::format("{} devices at once, {} thread{} each", n, threads, threads == 1 ? "" : "s");

    // memcpy: one device's copy while every device copies.
    {
      constexpr std::int64_t kBytes = std::int64_t{4} << 20;  // the collectives' chunk
      Tensor src = random({kBytes / 4}, 100 + static_cast<std::uint64_t>(comm.rank()));
      Tensor dst = Tensor::uninitialized(DType::kFloat32, {kBytes / 4});
      const double t =
          timed(comm, options.reps, [&] { std::memcpy(dst.bytes(), src.bytes(), kBytes); });
      m.memcpy_gbps = static_cast<double>(kBytes) / t / 1e9;
      say(fmt::format("memcpy: {} per device ({})", gbps(kBytes / t), at_once));
    }

    // Kernels: each probe's time on a core of its own, then the two rates.
    const double sharing = core_sharing(m, n, threads);
    std::vector<KernelProbe> probes = kernel_probes();
    struct Call {
      Op op;
      std::vector<TensorSpec> specs;
      std::vector<const Tensor*> in;
      double points = 0, bytes = 0;
    };
    std::vector<Call> calls;
    std::vector<std::function<void()>> runs;
    for (KernelProbe& p : probes) {
      Call c;
      std::vector<Shape> shapes;
      for (const Tensor& t : p.inputs) {
        c.specs.push_back(spec_of(t));
        c.in.push_back(&t);
        shapes.push_back(t.shape());
        c.bytes += static_cast<double>(t.nbytes());
      }
      c.op = normalize(p.op, c.specs);
      const Tensor out = run_kernel(c.op, c.in, c.specs);
      c.bytes += static_cast<double>(out.nbytes());
      c.points = work_points(c.op, c.specs, shapes, out.shape());
      calls.push_back(std::move(c));
    }
    for (const Call& c : calls) runs.push_back([&c] { run_kernel(c.op, c.in, c.specs); });
    const std::vector<double> times = timed_in_turn(comm, options.reps, runs);
    std::vector<KernelTime> kernels;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const double t = times[i];
      kernels.push_back({.t = t / sharing,
                         .x = 2 * calls[i].points,
                         .y = calls[i].bytes / 2,
                         .product = probes[i].product});
      say(fmt::format("kernel {}: {:.3f} ms ({})", probes[i].name, t * 1e3, at_once));
    }
    const auto [flops, element_bytes] = fit_kernel_rates(kernels);
    m.gemm_gflops = flops / 1e9;
    m.elementwise_gbps = element_bytes / 1e9;
    say(fmt::format("fit: products {:.1f} GFLOP/s, other kernels {} (one core of its own)",
                    m.gemm_gflops, gbps(element_bytes)));

    // The link between the devices.
    if (n >= 2) {
      const double mem = m.memcpy_gbps * 1e9;
      std::vector<CollectiveTime> colls;
      for (std::int64_t chunk : {std::int64_t{64}, std::int64_t{1} << 20}) {  // floats a device
        const auto nn = static_cast<std::int64_t>(n);
        Tensor send = random({nn * chunk}, 200 + static_cast<std::uint64_t>(comm.rank()));
        Tensor recv = Tensor::uninitialized(DType::kFloat32, {nn * chunk});
        const double b = static_cast<double>(chunk) * 4, nb = b * n;
        const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), chunk);
        // Each as the cost model prices it (step_seconds' terms for these bytes).
        auto step = [&](StepKind kind, double received, double in, double out) {
          return StepCostInput{.kind = kind,
                               .group_size = nn,
                               .bytes_received = static_cast<std::int64_t>(received),
                               .in_bytes = static_cast<std::int64_t>(in),
                               .out_bytes = static_cast<std::int64_t>(out)};
        };
        struct Case {
          std::string name;
          std::function<void()> run;
          StepCostInput priced;
        };
        const std::vector<Case> cases = {
            {"all_gather",
             [&] {
               all_gather(comm,
                          {.send = send.bytes(), .recv = recv.bytes(), .recv_counts = counts});
             },
             step(StepKind::kAllGather, (n - 1) * b, b, nb)},
            {"reduce_scatter",
             [&] {
               reduce_scatter(comm,
                              {.send = send.bytes(), .recv = recv.bytes(), .recv_counts = counts});
             },
             step(StepKind::kReduceScatter, (n - 1) * b, nb, b)},
            {"all_reduce",
             [&] {
               all_reduce(comm, {.send = send.bytes(), .recv = recv.bytes(), .count = nn * chunk});
             },
             step(StepKind::kAllReduce, 2 * (n - 1) * nb / n, nb, nb)},
            {"all_to_all",
             [&] {
               all_to_all(comm, {.send = send.bytes(),
                                 .send_counts = counts,
                                 .recv = recv.bytes(),
                                 .recv_counts = counts});
             },
             step(StepKind::kAllToAll, (n - 1) * b, nb, nb)},
            {"collective_permute",
             [&] {
               collective_permute(comm, {.send = send.bytes(),
                                         .send_count = chunk,
                                         .recv = recv.bytes(),
                                         .recv_count = chunk});
             },
             step(StepKind::kPermute, b, b, b)},
        };
        std::vector<std::function<void()>> collectives;
        for (const Case& c : cases) collectives.push_back(c.run);
        const std::vector<double> spans = timed_in_turn(comm, options.reps, collectives);
        for (std::size_t i = 0; i < cases.size(); ++i) {
          const Case& c = cases[i];
          colls.push_back({.t = spans[i],
                           .rounds = latency_rounds(c.priced),
                           .received = static_cast<double>(c.priced.bytes_received),
                           .memory = local_copy_bytes(c.priced) / mem});
          say(fmt::format("{} of {} bytes a device: {:.1f} us", c.name,
                          static_cast<std::int64_t>(b), spans[i] * 1e6));
        }
      }
      const auto [overhead, latency, per_byte] = fit_link(colls);
      m.collective_overhead_us = overhead * 1e6;
      LinkClass link{.bandwidth_gbps =
                         per_byte > 0 ? 1e-9 / per_byte
                                      : default_machine().links.at("shared_memory").bandwidth_gbps,
                     .latency_us = latency * 1e6,
                     .copies_on_cores = options.backend == Backend::kThreads};
      m.links[link_name] = link;
      m.default_link = link_name;
      say(fmt::format("fit: {} link {:.2f} GB/s, {:.1f} us a round, {:.1f} us a collective",
                      link_name, link.bandwidth_gbps, link.latency_us, m.collective_overhead_us));

      // What a collective costs where the devices come to it from computing: rounds of a product
      // then a collective of a few bytes, against the products alone and the collectives alone.
      constexpr int kRounds = 8;
      const auto work = std::find_if(probes.begin(), probes.end(), [](const KernelProbe& p) {
        return p.name == "matmul [512, 512] x [512, 2048]";
      });
      MESHFLOW_CHECK(work != probes.end());
      const Call& product = calls[static_cast<std::size_t>(work - probes.begin())];
      Tensor few = random({64}, 300 + static_cast<std::uint64_t>(comm.rank()));
      Tensor few_out = Tensor::uninitialized(DType::kFloat32, {64});
      auto meet = [&] {
        all_reduce(comm, {.send = few.bytes(), .recv = few_out.bytes(), .count = 64});
      };
      auto compute = [&] { run_kernel(product.op, product.in, product.specs); };
      auto products = [&] {
        for (int r = 0; r < kRounds; ++r) compute();
      };
      auto products_then_meets = [&] {
        for (int r = 0; r < kRounds; ++r) {
          compute();
          meet();
        }
      };
      auto meets = [&] {
        for (int r = 0; r < kRounds; ++r) meet();
      };
      const std::vector<double> t =
          timed_in_turn(comm, options.reps, {products, products_then_meets, meets});
      m.collective_sync_us = std::max(0.0, (t[1] - t[0] - t[2]) / kRounds * 1e6);
      say(fmt::format("a collective after a product ({}): {:.1f} us beyond both alone", work->name,
                      m.collective_sync_us));
    } else {
      say("one device: no link to measure; the built-in links and collective overhead stay");
    }
    // Every device fitted the same spans (time_between_barriers gives each the span); under
    // threads device 0 hands its copy out, under mpi each process keeps its own.
    if (comm.rank() == 0 || options.backend == Backend::kMpi) result[0] = m;
  });
  return result[0];
}

}  // namespace meshflow
