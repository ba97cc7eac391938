// The decomposed collective matmuls against the single-device GEMM, shared by the threads suite
// (meshflow/runtime/overlap_test.cc) and the mpi one (tests/overlap_mpi_test.cc).
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

// Runs fn(group) on devices 0..n-1 of `backend`, each through a recording communicator, and
// checks on each device that it made exactly `want` calls (collective -> count).
void on_devices(Backend backend, int n, const std::map<std::string, int>& want,
                const std::function<void(Communicator&)>& fn) {
  launch({.backend = backend, .devices = first_devices(n)}, [&](Communicator& comm) {
    auto log = std::make_shared<CallLog>();
    RecordingCommunicator recording(comm.devices(), comm.device(), log, comm.group(comm.devices()));
    fn(recording);
    std::map<std::string, int> calls;
    for (const RecordedCall& call : *log) ++calls[call.collective];
    EXPECT_EQ(calls, want) << "device " << comm.device() << " of " << n;
  });
}

Tensor rows(const Tensor& t, std::int64_t from, std::int64_t count) {
  return slice(t, Box{{from, 0}, {count, t.shape()[1]}});
}
Tensor cols(const Tensor& t, std::int64_t from, std::int64_t count) {
  return slice(t, Box{{0, from}, {t.shape()[0], count}});
}

}  // namespace

void check_allgather_matmul(Backend backend, const std::vector<int>& ranks) {
  for (int n : ranks) {
    const std::int64_t m = 2 * n + 1, k = 5, cols_n = 7;  // uneven row blocks
    const Tensor x = random_tensor(DType::kFloat32, {m, k}, 100 + n);
    const Tensor w = random_tensor(DType::kFloat32, {k, cols_n}, 200 + n);
    const Tensor want = compute(Op{.type = OpType::kMatmul}, {&x, &w});
    for (GatherForm form : {GatherForm::kPermute, GatherForm::kBroadcast}) {
      const std::map<std::string, int> calls =
          form == GatherForm::kPermute ? std::map<std::string, int>{{"collective_permute", n - 1}}
                                       : std::map<std::string, int>{{"broadcast", n}};
      on_devices(backend, n, calls, [&](Communicator& g) {
        const Chunk mine = chunk(m, n, g.rank());
        const Tensor y = allgather_matmul(g, rows(x, mine.offset, mine.extent), m, w, form);
        EXPECT_EQ(compare_close(y, want, 1e-5, 1e-6), std::nullopt) << n << " ranks";
      });
    }
  }
}

void check_matmul_reduce_scatter(Backend backend, const std::vector<int>& ranks) {
  for (int n : ranks) {
    const std::int64_t m = 3 * n - 1, k = 2 * n + 3, cols_n = 6;  // uneven rows and k blocks
    const Tensor x = random_tensor(DType::kFloat64, {m, k}, 300 + n);
    const Tensor w = random_tensor(DType::kFloat64, {k, cols_n}, 400 + n);
    const Tensor want = compute(Op{.type = OpType::kMatmul}, {&x, &w});
    on_devices(backend, n, {{"collective_permute", n - 1}}, [&](Communicator& g) {
      const Chunk kc = chunk(k, n, g.rank());
      const Tensor y =
          matmul_reduce_scatter(g, cols(x, kc.offset, kc.extent), rows(w, kc.offset, kc.extent));
      const Chunk mine = chunk(m, n, g.rank());
      EXPECT_EQ(compare_close(y, rows(want, mine.offset, mine.extent), 1e-12, 1e-12), std::nullopt)
          << n << " ranks";
    });
  }
}

}  // namespace meshflow::testing
