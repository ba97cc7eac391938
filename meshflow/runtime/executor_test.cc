#include "meshflow/runtime/executor.h"

#include <gtest/gtest.h>

#include "meshflow/comm/launch.h"
#include "meshflow/comm/recording.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {
namespace {

Layout L(const char* mesh, const char* placements, Shape shape, DType dtype = DType::kFloat32) {
  return make_layout(parse_mesh(mesh), parse_placements(placements), std::move(shape), dtype);
}

// Returns the calls `device` makes running the plan from -> to, one line each, recorded by the
// fake communicator (no data moves).
std::string calls_of(const Layout& from, const Layout& to, DeviceId device) {
  const Plan plan = plan_redistribute(from, to);
  const DeviceProgram program = lower(plan, device);
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator world(plan_devices(plan), device, log);
  execute(program, world, Tensor(program.dtype, program.in_shape));
  std::string out;
  for (const RecordedCall& c : *log) out += to_string(c) + "\n";
  return out;
}

TEST(ExecutorCalls, UnevenAllGatherIsOneVCollectiveStraightIntoTheResult) {
  EXPECT_EQ(calls_of(L("4", "S(0)", {13, 5}), L("4", "R", {13, 5}), 3),
            "all_gather float32 group [0,1,2,3] counts [20,20,20,5] sent 60 received 240 bytes\n");
}

TEST(ExecutorCalls, MergedAllReduceSpansTheFlattenedGroupOnce) {
  // Device 5 sits at (1,0,1): its group along mesh dims 0 and 2 fixes dim 1 at 0.
  EXPECT_EQ(
      calls_of(L("2x2x2", "P(sum),R,P(sum)", {16, 16, 16}), L("2x2x2", "R,R,R", {16, 16, 16}), 5),
      "all_reduce sum float32 group [0,1,4,5] counts [4096] sent 12288 received 12288 "
      "bytes\n");
}

TEST(ExecutorCalls, PartialAvgReduceScatterSumsThenDivides) {
  // The division is the program's, after the call: the collective itself sums.
  EXPECT_EQ(calls_of(L("4", "P(avg)", {8, 8}), L("4", "S(1)", {8, 8}), 0),
            "reduce_scatter sum float32 group [0,1,2,3] counts [16,16,16,16] sent 192 received "
            "192 bytes\n");
}

TEST(ExecutorCalls, ReplicateToPartialAndChunksMoveNothing) {
  EXPECT_EQ(calls_of(L("2x2", "R,R", {5, 3}), L("2x2", "S(0),P(sum)", {5, 3}), 2), "");
  EXPECT_EQ(calls_of(L("3", "R", {5}, DType::kInt64), L("3", "P(sum)", {5}, DType::kInt64), 1), "");
}

TEST(ExecutorCalls, CrossMeshIsOneExchangeOverTheUnionOfBothMeshes) {
  // Device 1 holds rows 3:5 and needs columns 0:2: 6 elements from device 0, 4 from itself;
  // it sends its rows' other column blocks to devices 2, 3 and 4 (4 + 2 + 2 elements).
  EXPECT_EQ(calls_of(L("2", "S(0)", {5, 3}), L("2x2@1,2,3,4", "S(1),R", {5, 3}), 1),
            "exchange_boxes float32 group [0,1,2,3,4] counts [6,4,0,0,0] sent 32 received 24 "
            "bytes\n");
  EXPECT_EQ(calls_of(L("2", "S(0)", {5, 3}), L("2x2@1,2,3,4", "S(1),R", {5, 3}), 4),
            "exchange_boxes float32 group [0,1,2,3,4] counts [3,2,0,0,0] sent 0 received 20 "
            "bytes\n");
}

TEST(ExecutorCalls, ADeviceInNeitherMeshMakesNoCall) {
  const Plan plan = plan_redistribute(L("2", "S(0)", {4}), L("2", "R", {4}));
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator world({0, 1, 2}, 2, log);
  const Tensor out = execute(lower(plan, 2), world, Tensor(DType::kFloat32, {0}));
  EXPECT_TRUE(log->empty());
  EXPECT_EQ(out.numel(), 0);
}

TEST(ExecutorCalls, AWrongShardIsRefusedNamingTheDevice) {
  const Plan plan = plan_redistribute(L("2", "S(0)", {4}), L("2", "R", {4}));
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator world({0, 1}, 1, log);
  try {
    execute(lower(plan, 1), world, Tensor(DType::kFloat32, {3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 1 holds a shard of 3 float32 but the plan "
                                         "expects 2 float32"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(log->empty());
}

TEST(ExecutorCalls, RecordingAroundARealBackendCountsAndStillMovesData) {
  // The recorder wraps the threads backend: the result is right and every call is counted.
  const Layout from = L("2x2", "S(0),S(1)", {6, 4});
  const Layout to = L("2x2", "R,R", {6, 4});
  const Tensor global = random_tensor(DType::kFloat32, {6, 4}, 7);
  const std::vector<Tensor> shards = shard_tensor(global, from);
  PlanCache cache;
  std::vector<std::size_t> calls(4);
  launch({.devices = first_devices(4)}, [&](Communicator& comm) {
    auto log = std::make_shared<CallLog>();
    RecordingCommunicator world(comm.devices(), comm.device(), log, comm.group(comm.devices()));
    const Tensor out =
        execute(*cache.program(from, to, comm.device()), world, shards[comm.device()]);
    EXPECT_EQ(compare_exact(out, global), std::nullopt);
    calls[comm.device()] = log->size();
  });
  const std::size_t steps = cache.get(from, to)->steps.size();
  for (std::size_t n : calls) EXPECT_EQ(n, steps);
}

}  // namespace
}  // namespace meshflow
