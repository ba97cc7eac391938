// The decomposed collective matmuls against the single-device GEMM, for n = 2, 3, 4 and 8 ranks
// with uneven blocks, with their communication counted by the recording communicator: n - 1
// permutes for the permute form and the reduce-scatter, n broadcasts for the broadcast form.
#include "meshflow/runtime/overlap.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "meshflow/comm/launch.h"
#include "meshflow/comm/recording.h"
#include "meshflow/core/box.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"

namespace meshflow {
namespace {

struct Counts {
  std::map<std::string, int> calls;  // per collective, on every device alike
};

// Runs fn(recording group) on n device threads; returns device 0's call counts and checks
// every device made the same calls.
Counts on_devices(int n, const std::function<void(Communicator&)>& fn) {
  std::mutex mu;
  std::map<DeviceId, CallLog> logs;
  launch({.devices = first_devices(n)}, [&](Communicator& comm) {
    auto log = std::make_shared<CallLog>();
    RecordingCommunicator recording(comm.devices(), comm.device(), log, comm.group(comm.devices()));
    fn(recording);
    std::lock_guard lock(mu);
    logs[comm.device()] = *log;
  });
  Counts c;
  for (const RecordedCall& call : logs[0]) ++c.calls[call.collective];
  for (const auto& [d, log] : logs) EXPECT_EQ(log.size(), logs[0].size()) << "device " << d;
  return c;
}

Tensor rows(const Tensor& t, std::int64_t from, std::int64_t count) {
  return slice(t, Box{{from, 0}, {count, t.shape()[1]}});
}
Tensor cols(const Tensor& t, std::int64_t from, std::int64_t count) {
  return slice(t, Box{{0, from}, {t.shape()[0], count}});
}

TEST(Overlap, AllGatherMatmulEqualsTheGemmInBothForms) {
  for (int n : {2, 3, 4, 8}) {
    const std::int64_t m = 2 * n + 1, k = 5, cols_n = 7;  // uneven row blocks
    const Tensor x = random_tensor(DType::kFloat32, {m, k}, 100 + n);
    const Tensor w = random_tensor(DType::kFloat32, {k, cols_n}, 200 + n);
    const Tensor want = compute(Op{.type = OpType::kMatmul}, {&x, &w});
    for (GatherForm form : {GatherForm::kPermute, GatherForm::kBroadcast}) {
      const Counts c = on_devices(n, [&](Communicator& g) {
        const Chunk mine = chunk(m, n, g.rank());
        const Tensor y = allgather_matmul(g, rows(x, mine.offset, mine.extent), m, w, form);
        EXPECT_EQ(compare_close(y, want, 1e-5, 1e-6), std::nullopt) << n << " ranks";
      });
      if (form == GatherForm::kPermute) {
        EXPECT_EQ(c.calls, (std::map<std::string, int>{{"collective_permute", n - 1}}));
      } else {
        EXPECT_EQ(c.calls, (std::map<std::string, int>{{"broadcast", n}}));
      }
    }
  }
}

TEST(Overlap, MatmulReduceScatterEqualsTheGemmsRowBlocks) {
  for (int n : {2, 3, 4, 8}) {
    const std::int64_t m = 3 * n - 1, k = 2 * n + 3, cols_n = 6;  // uneven rows and k blocks
    const Tensor x = random_tensor(DType::kFloat64, {m, k}, 300 + n);
    const Tensor w = random_tensor(DType::kFloat64, {k, cols_n}, 400 + n);
    const Tensor want = compute(Op{.type = OpType::kMatmul}, {&x, &w});
    const Counts c = on_devices(n, [&](Communicator& g) {
      const Chunk kc = chunk(k, n, g.rank());
      const Tensor y =
          matmul_reduce_scatter(g, cols(x, kc.offset, kc.extent), rows(w, kc.offset, kc.extent));
      const Chunk mine = chunk(m, n, g.rank());
      EXPECT_EQ(compare_close(y, rows(want, mine.offset, mine.extent), 1e-12, 1e-12), std::nullopt)
          << n << " ranks";
    });
    EXPECT_EQ(c.calls, (std::map<std::string, int>{{"collective_permute", n - 1}}));
  }
}

}  // namespace
}  // namespace meshflow
