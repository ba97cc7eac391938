// The step-time estimate against hand-counted work: a matrix product's flops at the GEMM rate,
// data parallelism halving each device's products and adding the gradient reductions' plans,
// micro-batches leaving the work and the reductions as they are.
#include "meshflow/graph/step_time.h"

#include <gtest/gtest.h>

#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/passes.h"

namespace meshflow {
namespace {

constexpr std::int64_t kBatch = 64, kIn = 256, kOut = 48;

// h = x[batch, in] @ w[in, out]; loss = mse(h, t): x and t split over `devices` (data
// parallel), w replicated.
Pcg regression(int devices) {
  Pcg g;
  const DeviceMesh mesh = parse_mesh(std::to_string(devices));
  const auto batch = parse_placements("S(0)");
  const ValueId x = add_input(g, "x", {{kBatch, kIn}}, mesh, batch, Source::normal(1, 1));
  const ValueId t = add_input(g, "t", {{kBatch, kOut}}, mesh, batch, Source::normal(1, 2));
  const ValueId w =
      add_weight(g, "w", {{kIn, kOut}}, mesh, parse_placements("R"), Source::normal(0.1, 3));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kMatmul}, {x, w});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {h, t}));
  return g;
}

// A machine whose products run at 1 GFLOP/s and everything else at no cost to speak of, one
// core per device.
MachineModel products_only() {
  MachineModel m = default_machine();
  m.gemm_gflops = 1;
  m.elementwise_gbps = 1e9;
  m.cores = 0;
  return m;
}

std::vector<StepTime> estimate(const Pcg& model, int micro_batches, const MachineModel& m) {
  const CompileOptions options{.plan = {.machine = &m}, .micro_batches = micro_batches};
  const Pcg g = compile(model, Mode::kTrain, options);
  return estimate_step_time(g, expand_shards(g, {*g.loss}, options.plan), micro_batches,
                            options.plan);
}

// The forward product and the weight's gradient xᵀ g (the input x needs none): 2 * 2 * B*I*O
// flops; the elementwise kernels' points (a few per element of h) also run at the GEMM rate.
TEST(StepTime, ProductsCostTheirFlopsAtTheGemmRate) {
  const MachineModel m = products_only();
  const std::vector<StepTime> one = estimate(regression(1), 1, m);
  ASSERT_EQ(one.size(), 1u);
  const double products = 2.0 * 2 * kBatch * kIn * kOut / 1e9;
  const double elementwise = 16.0 * kBatch * kOut / 1e9;  // mse, its gradient, the update: bound
  EXPECT_GE(one[0].compute_s, products);
  EXPECT_LE(one[0].compute_s, products + elementwise);
  EXPECT_EQ(one[0].move_s, 0);
  EXPECT_EQ(slowest(one), one[0].total());
}

// Two devices: each runs half the rows; the moves (the weight gradient's all-reduce, the squared
// norm's sum) are priced as explain prices them.
TEST(StepTime, DataParallelHalvesTheProductsAndAddsTheGradientReduction) {
  const MachineModel m = products_only();
  const double one = estimate(regression(1), 1, m)[0].compute_s;
  const std::vector<StepTime> two = estimate(regression(2), 1, m);
  ASSERT_EQ(two.size(), 2u);
  const Explanation e = explain_compiled(regression(2), {.plan = {.machine = &m}});
  ASSERT_EQ(e.moves.size(), 2u) << to_text(e);
  for (const StepTime& t : two) {
    EXPECT_NEAR(t.compute_s, one / 2, one * 0.02) << "device " << t.device;
    EXPECT_DOUBLE_EQ(t.move_s, e.moves[0].est_s + e.moves[1].est_s) << "device " << t.device;
  }
  ASSERT_TRUE(e.step_time.has_value());
  EXPECT_DOUBLE_EQ(e.step_time->total(), slowest(two));
}

// The devices come to a collective apart by what they computed since they last met: each move
// that communicates pays collective_sync_us, at most the work since the device's previous one.
// One device meets no peer and pays nothing.
TEST(StepTime, ACollectiveAfterWorkPaysTheDevicesArrivingApart) {
  MachineModel m = default_machine();
  m.cores = 0;
  const std::vector<StepTime> alone = estimate(regression(1), 1, m);
  const std::vector<StepTime> two = estimate(regression(2), 1, m);
  const Explanation e = explain_compiled(regression(2), {.plan = {.machine = &m}});
  ASSERT_EQ(e.moves.size(), 2u) << to_text(e);  // the gradient's all-reduce, the norm's sum
  m.collective_sync_us = 0.001;                 // less than any work between two moves
  EXPECT_EQ(estimate(regression(1), 1, m)[0].total(), alone[0].total());
  const std::vector<StepTime> little = estimate(regression(2), 1, m);
  for (std::size_t d = 0; d < two.size(); ++d) {
    EXPECT_NEAR(little[d].move_s, two[d].move_s + 2 * 1e-9, 1e-15) << "device " << d;
    EXPECT_EQ(little[d].compute_s, two[d].compute_s);
  }
  m.collective_sync_us = 1e6;  // more than the whole step's work: each pays the work before it
  const std::vector<StepTime> bounded = estimate(regression(2), 1, m);
  for (std::size_t d = 0; d < two.size(); ++d) {
    const double paid = bounded[d].move_s - two[d].move_s;
    EXPECT_GE(paid, two[d].compute_s * 0.5) << "device " << d;  // the forward and backward
    EXPECT_LE(paid, two[d].compute_s + two[d].update_s + 1e-12) << "device " << d;
  }
}

// Four micro-batches: the same products in quarters, the gradient reduced once per step, one
// update; what is added is the accumulation of the gradient (one add per micro-batch after the
// first and a scale, each a pass over it).
TEST(StepTime, MicroBatchesKeepTheWorkAndReduceOncePerStep) {
  MachineModel m = products_only();
  const std::vector<StepTime> whole = estimate(regression(2), 1, m);
  const std::vector<StepTime> micro = estimate(regression(2), 4, m);
  ASSERT_EQ(micro.size(), 2u);
  for (std::size_t d = 0; d < 2; ++d) {
    EXPECT_NEAR(micro[d].compute_s, whole[d].compute_s, whole[d].compute_s * 0.02);
    EXPECT_DOUBLE_EQ(micro[d].move_s, whole[d].move_s);
    EXPECT_DOUBLE_EQ(micro[d].update_s, whole[d].update_s);
  }
  // With memory traffic priced, four micro-batches add passes of the weight's bytes over the
  // single batch's step: 3 more reads of the weight (each micro-batch's product), 3 more whole
  // gradients written (each micro-batch's xᵀ g), the 3 reads of the sum those products add
  // into (Task::accumulates: the GEMM's beta = 1) and one scale (read, write).
  m.elementwise_gbps = 1;
  m.gemm_gflops = 1e9;
  const double grad_bytes = kIn * kOut * 4;
  const double added =
      estimate(regression(1), 4, m)[0].compute_s - estimate(regression(1), 1, m)[0].compute_s;
  const double pass = grad_bytes / 2e9;  // kernel_seconds' bytes: read and write count alike
  EXPECT_NEAR(added, (3 + 3 + 3 + 2) * pass, pass / 2);
}

// The update (SGD: reads the gradient, reads and writes the weight) and the gradient norm (reads
// the gradient) stream at the memcpy rate, whatever the elementwise rate and the cores: that
// rate was measured with every device copying at once.
TEST(StepTime, TheUpdateStreamsAtTheMemcpyRate) {
  MachineModel m = products_only();
  m.memcpy_gbps = 1;  // 2 bytes (one read, one write) a nanosecond
  const double weight = kIn * kOut * 4;
  for (int cores : {0, 4}) {
    m.cores = cores;
    EXPECT_NEAR(estimate(regression(1), 1, m)[0].update_s, (3 + 1) * weight / 2e9, 1e-12)
        << cores << " cores";
  }
}

// Devices and cores: one device on 4 cores splits its kernels over 4 threads (a quarter of the
// time), 2 devices on 4 cores over 2 each, 8 devices on 4 cores take turns (twice the time).
TEST(StepTime, DevicesSplitOrShareTheMachinesCores) {
  const MachineModel alone = products_only();
  MachineModel four = alone;
  four.cores = 4;
  for (int devices : {1, 2, 8}) {
    const double own = estimate(regression(devices), 1, alone)[0].compute_s;
    const double shared = estimate(regression(devices), 1, four)[0].compute_s;
    const double want = devices == 1 ? 0.25 : devices == 2 ? 0.5 : 2.0;
    EXPECT_NEAR(shared, own * want, own * 1e-9) << devices << " devices";
  }
}

}  // namespace
}  // namespace meshflow
