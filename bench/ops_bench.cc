#include "bench/ops_bench.h"

#include <cblas.h>

#include <functional>
#include <mutex>

#include "bench/collectives_bench.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/random.h"
#include "meshflow/dtensor/dtensor.h"

namespace meshflow::bench {

namespace {

constexpr int kDispatchCalls = 20000;
constexpr double kDispatchTarget_s = 2e-6;

// Every device's DTensor of a random global tensor.
DTensor random_dtensor(Communicator& comm, const DeviceMesh& mesh, const char* placements,
                       const Shape& shape, std::uint64_t seed) {
  return distribute_tensor(comm, random_tensor(DType::kFloat32, shape, seed), mesh,
                           parse_placements(placements));
}

// Times `ours` and `other` alternately on every device (warm-up rounds first) and appends device
// 0's spans to `ours_s` and `other_s`.
void interleaved(Communicator& comm, const OpsBenchOptions& o, const std::function<void()>& ours,
                 const std::function<void()>& other, std::mutex& mu, std::vector<double>& ours_s,
                 std::vector<double>& other_s) {
  for (int rep = -o.warmup; rep < o.reps; ++rep) {
    const double a = time_between_barriers(comm, ours);
    const double b = time_between_barriers(comm, other);
    if (rep >= 0 && comm.device() == 0) {
      std::lock_guard lock(mu);
      ours_s.push_back(a);
      other_s.push_back(b);
    }
  }
}

BenchResult dispatch_case(const OpsBenchOptions& o) {
  const DeviceMesh mesh = make_mesh({o.devices});
  BenchResult r{.case_name = "dispatch",
                .backend = "threads",
                .mesh = to_string(mesh),
                .devices = o.devices,
                .bytes = 0};
  std::mutex mu;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    const Shape shape{o.devices};
    const DTensor a = random_dtensor(comm, mesh, "S(0)", shape, 1);
    const DTensor b = random_dtensor(comm, mesh, "S(0)", shape, 2);
    for (int rep = -o.warmup; rep < o.reps; ++rep) {
      OpProfile p;
      attach_profile(&p);
      for (int i = 0; i < kDispatchCalls; ++i) add(a, b);
      attach_profile(nullptr);
      if (rep >= 0 && comm.device() == 0) {
        std::lock_guard lock(mu);
        r.case_s.push_back((p.total_s - p.kernel_s - p.movement_s) / static_cast<double>(p.calls));
      }
    }
  });
  r.extra["op"] = "add of S(0) operands, no data moved";
  r.extra["target_s"] = kDispatchTarget_s;
  return r;
}

BenchResult gemm_case(const OpsBenchOptions& o) {
  const DeviceMesh mesh = make_mesh({o.devices});
  const std::int64_t m = 512, k = 1024, n = 1024;
  BenchResult r{.case_name = "gemm",
                .backend = "threads",
                .mesh = to_string(mesh),
                .devices = o.devices,
                .bytes = (o.devices * m * k + k * n) * 4};
  r.baseline = "cblas_sgemm";
  std::mutex mu;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    const DTensor x = random_dtensor(comm, mesh, "S(0)", {o.devices * m, k}, 3);
    const DTensor w = random_dtensor(comm, mesh, "R", {k, n}, 4);
    Tensor c(DType::kFloat32, {m, n});
    auto bare = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                  static_cast<int>(n), static_cast<int>(k), 1.0f, x.local.data<float>().data(),
                  static_cast<int>(k), w.local.data<float>().data(), static_cast<int>(n), 0.0f,
                  c.data<float>().data(), static_cast<int>(n));
    };
    interleaved(
        comm, o, [&] { matmul(x, w); }, bare, mu, r.case_s, r.baseline_s);
  });
  r.extra["local_shape"] = fmt::format("{}x{} @ {}x{}", m, k, k, n);
  return r;
}

BenchResult elementwise_case(const OpsBenchOptions& o) {
  const DeviceMesh mesh = make_mesh({o.devices});
  const std::int64_t per_device = std::int64_t{4} << 20;  // elements: 16 MiB per operand
  BenchResult r{.case_name = "elementwise",
                .backend = "threads",
                .mesh = to_string(mesh),
                .devices = o.devices,
                .bytes = 3 * per_device * o.devices * 4};
  std::mutex mu;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    const Shape shape{o.devices * per_device};
    const DTensor a = random_dtensor(comm, mesh, "S(0)", shape, 5);
    const DTensor b = random_dtensor(comm, mesh, "S(0)", shape, 6);
    Tensor c(DType::kFloat32, {per_device});
    auto plain = [&] {
      const float* x = a.local.data<float>().data();
      const float* y = b.local.data<float>().data();
      float* z = c.data<float>().data();
      for (std::int64_t i = 0; i < per_device; ++i) z[i] = x[i] + y[i];
    };
    interleaved(
        comm, o, [&] { add(a, b); }, plain, mu, r.case_s, r.floor_s);
  });
  r.extra["op"] = "add, two 16 MiB float32 shards per device";
  return r;
}

BenchResult tp_mlp_case(int devices, const OpsBenchOptions& o) {
  const std::int64_t batch = 512, in = 1024, hidden = 4096, out = 1024;
  const DeviceMesh mesh = make_mesh({devices});
  BenchResult r{.case_name = "tp_mlp_forward",
                .backend = "threads",
                .mesh = to_string(mesh),
                .devices = devices,
                .bytes = (batch * in + in * hidden + hidden * out) * 4};
  r.baseline = "sequential";
  const Tensor x = random_tensor(DType::kFloat32, {batch, in}, 7);
  const Tensor w1 = random_tensor(DType::kFloat32, {in, hidden}, 8);
  const Tensor b1 = random_tensor(DType::kFloat32, {hidden}, 9);
  const Tensor w2 = random_tensor(DType::kFloat32, {hidden, out}, 10);
  const Tensor b2 = random_tensor(DType::kFloat32, {out}, 11);
  auto sequential = [&] {
    const Tensor h = compute({.type = OpType::kLinear}, {&x, &w1, &b1});
    const Tensor a = compute({.type = OpType::kGelu}, {&h});
    compute({.type = OpType::kLinear}, {&a, &w2, &b2});
  };
  std::vector<double> kernel, movement, overhead;
  std::mutex mu;
  launch({.devices = mesh.devices}, [&](Communicator& comm) {
    auto place = [&](const Tensor& t, const char* p) {
      return distribute_tensor(comm, t, mesh, parse_placements(p));
    };
    const DTensor dx = place(x, "R"), dw1 = place(w1, "S(1)"), db1 = place(b1, "S(0)");
    const DTensor dw2 = place(w2, "S(0)"), db2 = place(b2, "R");
    for (int rep = -o.warmup; rep < o.reps; ++rep) {
      OpProfile p;
      double reduce_s = 0;
      const double total = time_between_barriers(comm, [&] {
        attach_profile(&p);
        const DTensor y = linear(gelu(linear(dx, dw1, db1)), dw2, db2);
        attach_profile(nullptr);
        reduce_s = time_once([&] { redistribute(y, {Placement::replicate()}); });
      });
      const double seq = comm.device() == 0 ? time_once(sequential) : 0;
      barrier(comm);
      if (rep >= 0 && comm.device() == 0) {
        std::lock_guard lock(mu);
        r.case_s.push_back(total);
        r.baseline_s.push_back(seq);
        kernel.push_back(p.kernel_s);
        movement.push_back(p.movement_s + reduce_s);
        overhead.push_back(total - p.kernel_s - p.movement_s - reduce_s);
      }
    }
  });
  r.extra["kernel_s"] = median(kernel);
  r.extra["movement_s"] = median(movement);
  r.extra["overhead_s"] = median(overhead);
  return r;
}

}  // namespace

BenchReport run_ops_bench(const OpsBenchOptions& options) {
  BenchReport report{.benchmark = "ops", .progress = options.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  add_result(report, dispatch_case(options));
  add_result(report, gemm_case(options));
  add_result(report, elementwise_case(options));
  for (int d : {1, 2, 4}) add_result(report, tp_mlp_case(d, options));
  return report;
}

}  // namespace meshflow::bench
