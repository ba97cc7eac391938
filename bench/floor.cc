#include "bench/floor.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/kernels/gemm.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"
#include "meshflow/ops/attention.h"

namespace meshflow::bench {

namespace {

constexpr std::int64_t kF = sizeof(float);

}  // namespace

MemoryFloor::MemoryFloor(const std::vector<FloorRead>& reads, std::int64_t writes)
    : to_(Tensor::uninitialized(DType::kFloat32,
                                {std::max<std::int64_t>(1, (writes + kF - 1) / kF)})) {
  // Faulted in before the first run, and not zero: the bytes run() zeroes are its doing.
  std::memset(to_.bytes(), 0xff, to_.nbytes());
  std::byte* to = to_.bytes();
  std::int64_t room = writes;
  for (const FloorRead& r : reads) {
    const auto size = static_cast<std::int64_t>(r.from->nbytes());
    const std::int64_t n = r.bytes < 0 ? size : r.bytes;
    MESHFLOW_CHECK(n % kF == 0 && n <= size, "a floor's read of {} bytes of {}", n, size);
    const std::int64_t copied = std::min(n, room);
    if (copied > 0) pieces_.push_back({r.from->bytes(), to, copied});
    if (n > copied) pieces_.push_back({r.from->bytes() + copied, nullptr, n - copied});
    to += copied;
    room -= copied;
    bytes_ += n;
  }
  if (room > 0) pieces_.push_back({nullptr, to, room});
  bytes_ += writes;
}

void MemoryFloor::run() {
  const int parts = team_threads();
  std::vector<float> sums(static_cast<std::size_t>(parts));
  parallel_parts_for(parts, parts, [&](int part, std::int64_t, std::int64_t) {
    float sum = 0;
    for (const Piece& p : pieces_) {
      // Whole cache lines per part; a read piece's bounds stay on floats.
      const std::int64_t begin = part_begin(p.bytes, parts, part, 64);
      const std::int64_t n = part_begin(p.bytes, parts, part + 1, 64) - begin;
      if (n == 0) continue;
      if (p.from == nullptr) {
        std::memset(p.to + begin, 0, static_cast<std::size_t>(n));
      } else if (p.to == nullptr) {
        sum += vector_math().sum(reinterpret_cast<const float*>(p.from + begin), n / kF);
      } else {
        std::memcpy(p.to + begin, p.from + begin, static_cast<std::size_t>(n));
      }
    }
    sums[static_cast<std::size_t>(part)] = sum;
  });
  float total = 0;
  for (float s : sums) total += s;
  sink_ = total;
}

ProductFloor::ProductFloor(const TaskGraph& t, int micro_batches, int threads) {
  for (const DeviceTasks& dt : t.devices) {
    Device& d = devices_.emplace_back(Device{.team = std::make_unique<ThreadTeam>(threads)});
    for (const Task& task : dt.tasks) {
      const auto* c = std::get_if<ComputeTask>(&task.work);
      if (!c) continue;
      std::vector<Shape> local;
      for (ValueId v : c->call->args)
        local.push_back(local_shape(t.layouts[static_cast<std::size_t>(v)], dt.device));
      const int times = task.once_per_step ? 1 : micro_batches;
      for (int i = 0; i < times; ++i) {
        add(d.products, c->call->op.type, local);
        for (const FusedKernel& f : c->fused) add(d.products, f.op.type, local);
      }
    }
    std::int64_t most = 1;
    for (const Product& p : d.products) most = std::max({most, p.m * p.k, p.k * p.n, p.m * p.n});
    for (auto* buffer : {&d.a, &d.b, &d.c}) *buffer = random_tensor(DType::kFloat32, {most}, 7);
  }
}

double ProductFloor::time() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> others;
  for (std::size_t i = 1; i < devices_.size(); ++i)
    others.emplace_back([this, i] { run(devices_[i]); });
  run(devices_.front());
  for (std::thread& th : others) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ProductFloor::run(Device& d) {
  const UseTeam use(d.team.get());
  for (const Product& p : d.products) {
    for (std::int64_t i = 0; i < p.batch; ++i)
      gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, d.a.data<float>().data(),
                  p.trans_a ? p.m : p.k, d.b.data<float>().data(), p.trans_b ? p.k : p.n, 0.0f,
                  d.c.data<float>().data(), p.n);
  }
}

namespace {

std::int64_t rows(const Shape& s) {
  std::int64_t r = 1;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}

}  // namespace

void ProductFloor::add(std::vector<Product>& products, OpType type, const std::vector<Shape>& in) {
  auto gemm_of = [&](bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                     std::int64_t k) {
    products.push_back({.trans_a = ta, .trans_b = tb, .batch = batch, .m = m, .n = n, .k = k});
  };
  switch (type) {
    case OpType::kMatmul:
    case OpType::kLinear:  // a[.., m, k] @ b[k, n]
      return gemm_of(false, false, 1, rows(in[0]), in[1][1], in[1][0]);
    case OpType::kMatmulGradA:  // g[.., m, n] @ b[k, n]ᵀ
      return gemm_of(false, true, 1, rows(in[0]), in[1][0], in[1][1]);
    case OpType::kMatmulGradB:  // a[.., m, k]ᵀ @ g[.., m, n]
      return gemm_of(true, false, 1, in[0].back(), in[1].back(), rows(in[0]));
    default:
      break;
  }
  if (!is_attention_family(type) && type != OpType::kCachedAttention) return;
  const Shape& q = in[0];
  const std::int64_t batch = rows(q) / q[q.size() - 2], sq = q[q.size() - 2], dk = q.back();
  // A cached attention over a prompt run whole (prefill) reads its own rows' keys.
  const std::int64_t sk = type == OpType::kCachedAttention ? sq : in[1][in[1].size() - 2];
  const std::int64_t dv = in[2].back();
  switch (type) {
    case OpType::kAttention:  // q kᵀ, then P v
    case OpType::kCachedAttention:
      gemm_of(false, true, batch, sq, sk, dk);
      return gemm_of(false, false, batch, sq, dv, sk);
    case OpType::kAttentionGradQ:  // dP = g vᵀ, dq = dS k
      gemm_of(false, true, batch, sq, sk, dv);
      return gemm_of(false, false, batch, sq, dk, sk);
    case OpType::kAttentionGradK:  // dk = dSᵀ q
      return gemm_of(true, false, batch, sk, dk, sq);
    default:  // dv = Pᵀ g
      return gemm_of(true, false, batch, sk, dv, sq);
  }
}

}  // namespace meshflow::bench
