// The decomposed collective products against single-device products, shared by the threads
// suite (meshflow/runtime/overlap_test.cc) and the mpi one (tests/overlap_mpi_test.cc).
#include "tests/overlap_check.h"

#include <gtest/gtest.h>

#include <map>

#include "meshflow/comm/recording.h"
#include "meshflow/core/box.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"
#include "meshflow/runtime/overlap.h"

namespace meshflow::testing {

namespace {

using Calls = std::map<std::string, int>;

// Runs fn(group) on devices 0..n-1 of `backend`, each through a recording communicator, and
// checks on each device that it made exactly `want` calls (collective -> count).
void on_devices(Backend backend, int n, const Calls& want,
                const std::function<void(Communicator&)>& fn) {
  launch({.backend = backend, .devices = first_devices(n)}, [&](Communicator& comm) {
    auto log = std::make_shared<CallLog>();
    RecordingCommunicator recording(comm.devices(), comm.device(), log, comm.group(comm.devices()));
    fn(recording);
    Calls calls;
    for (const RecordedCall& call : *log) ++calls[call.collective];
    EXPECT_EQ(calls, want) << "device " << comm.device() << " of " << n;
  });
}

Calls calls_of(GatherForm form, int n) {
  switch (form) {
    case GatherForm::kPermute:
      return {{"collective_permute", n - 1}};
    case GatherForm::kBroadcast:
      return {{"broadcast", n}};
    case GatherForm::kInPlace:  // the blocks' addresses, then the closing barrier
      return {{"all_gather", 1}, {"barrier", 1}};
  }
  return {};
}

// The reduce-scatter loop's calls: the ring's permutes, or in place the results' addresses and
// a barrier before each later step.
Calls scatter_calls_of(GatherForm form, int n) {
  if (form == GatherForm::kInPlace) return {{"all_gather", 1}, {"barrier", n - 1}};
  return {{"collective_permute", n - 1}};
}

Calls plus(Calls a, const Calls& b) {
  for (const auto& [call, count] : b) a[call] += count;
  return a;
}

// The gather forms `backend` runs: the in-place one only where devices share memory.
std::vector<GatherForm> forms_of(Backend backend) {
  if (backend == Backend::kThreads)
    return {GatherForm::kPermute, GatherForm::kBroadcast, GatherForm::kInPlace};
  return {GatherForm::kPermute, GatherForm::kBroadcast};
}

// The reduce-scatter forms: the ring, and in place where devices share memory.
std::vector<GatherForm> scatter_forms_of(Backend backend) {
  if (backend == Backend::kThreads) return {GatherForm::kPermute, GatherForm::kInPlace};
  return {GatherForm::kPermute};
}

// Returns `count` elements of t's dim `dim` from `from`.
Tensor part(const Tensor& t, int dim, std::int64_t from, std::int64_t count) {
  Box box{std::vector<std::int64_t>(t.shape().size(), 0), t.shape()};
  box.offset[static_cast<std::size_t>(dim)] = from;
  box.extent[static_cast<std::size_t>(dim)] = count;
  return slice(t, box);
}
Tensor chunk_of(const Tensor& t, int dim, int n, int rank) {
  const Chunk c = chunk(t.shape()[static_cast<std::size_t>(dim)], n, rank);
  return part(t, dim, c.offset, c.extent);
}

void expect_close(const Tensor& got, const Tensor& want, int n, const char* what) {
  const double tol = got.dtype() == DType::kFloat64 ? 1e-12 : 1e-5;
  EXPECT_EQ(compare_close(got, want, tol, tol), std::nullopt) << what << ", " << n << " ranks";
}

// Every gather form, each with a reduce-scatter form, so that every form of both runs.
std::vector<std::pair<GatherForm, GatherForm>> form_pairs(Backend backend) {
  const std::vector<GatherForm> gathers = forms_of(backend), scatters = scatter_forms_of(backend);
  std::vector<std::pair<GatherForm, GatherForm>> out;
  for (std::size_t i = 0; i < gathers.size(); ++i)
    out.emplace_back(gathers[i], scatters[i % scatters.size()]);
  return out;
}

}  // namespace

void check_allgather_product(Backend backend, const std::vector<int>& ranks) {
  for (int n : ranks) {
    const std::int64_t m = 2 * n + 1, k = 5, out = 3 * n + 1;  // uneven row and column blocks
    const Tensor x = random_tensor(DType::kFloat32, {m, 2, k}, 100 + n);
    const Tensor w = random_tensor(DType::kFloat32, {k, out}, 200 + n);
    const Tensor b = random_tensor(DType::kFloat32, {out}, 250 + n);
    const Tensor dy = random_tensor(DType::kFloat32, {m, 2, out}, 260 + n);
    const Tensor y = compute(Op{.type = OpType::kLinear}, {&x, &w, &b});
    const Tensor dx = compute(Op{.type = OpType::kMatmulGradA}, {&dy, &w});
    for (const auto& [form, scatter] : form_pairs(backend)) {
      // The forward gather, the backward reduce-scatter.
      on_devices(backend, n, plus(calls_of(form, n), scatter_calls_of(scatter, n)),
                 [&](Communicator& g) {
                   const int r = g.rank();
                   const Tensor w_local = chunk_of(w, 1, n, r), b_local = chunk_of(b, 0, n, r);
                   const Tensor* rest[] = {&w_local, &b_local};
                   Tensor gathered;
                   const Tensor y_local =
                       allgather_product(g, Op{.type = OpType::kLinear}, chunk_of(x, 0, n, r), m,
                                         rest, {.form = form, .gathered = &gathered});
                   expect_close(y_local, chunk_of(y, 2, n, r), n, "forward");
                   EXPECT_EQ(compare_close(gathered, x, 0, 0), std::nullopt) << "gathered x, " << n;
                   const Tensor* w_only[] = {&w_local};
                   const Tensor dx_local =
                       product_reduce_scatter(g, Op{.type = OpType::kMatmulGradA},
                                              chunk_of(dy, 2, n, r), w_only, {.form = scatter});
                   expect_close(dx_local, chunk_of(dx, 0, n, r), n, "backward");
                 });
    }
  }
}

void check_product_reduce_scatter(Backend backend, const std::vector<int>& ranks) {
  for (int n : ranks) {
    const std::int64_t m = 3 * n - 1, k = 2 * n + 3, out = 6;  // uneven rows and k blocks
    const Tensor x = random_tensor(DType::kFloat64, {m, k}, 300 + n);
    const Tensor w = random_tensor(DType::kFloat64, {k, out}, 400 + n);
    const Tensor dy = random_tensor(DType::kFloat64, {m, out}, 450 + n);
    const Tensor b = random_tensor(DType::kFloat64, {out}, 470 + n);
    // A linear's term per rank carries the bias, so the sum carries it n times.
    Tensor nb = b.clone();
    for (double& v : nb.data<double>()) v *= n;
    const Tensor y = compute(Op{.type = OpType::kMatmul}, {&x, &w});
    const Tensor y_linear = compute(Op{.type = OpType::kLinear}, {&x, &w, &nb});
    const Tensor dx = compute(Op{.type = OpType::kMatmulGradA}, {&dy, &w});
    for (const auto& [form, scatter] : form_pairs(backend)) {
      // Two forward reduce-scatters, the backward gather.
      Calls calls = plus(scatter_calls_of(scatter, n), scatter_calls_of(scatter, n));
      on_devices(backend, n, plus(calls, calls_of(form, n)), [&](Communicator& g) {
        const int r = g.rank();
        const Tensor w_local = chunk_of(w, 0, n, r);
        const Tensor* rest[] = {&w_local};
        const Tensor y_local = product_reduce_scatter(
            g, Op{.type = OpType::kMatmul}, chunk_of(x, 1, n, r), rest, {.form = scatter});
        expect_close(y_local, chunk_of(y, 0, n, r), n, "forward");
        const Tensor* with_bias[] = {&w_local, &b};
        const Tensor y_linear_local = product_reduce_scatter(
            g, Op{.type = OpType::kLinear}, chunk_of(x, 1, n, r), with_bias, {.form = scatter});
        expect_close(y_linear_local, chunk_of(y_linear, 0, n, r), n, "forward linear");
        const Tensor dx_local = allgather_product(g, Op{.type = OpType::kMatmulGradA},
                                                  chunk_of(dy, 0, n, r), m, rest, {.form = form});
        expect_close(dx_local, chunk_of(dx, 1, n, r), n, "backward");
      });
    }
  }
}

}  // namespace meshflow::testing
