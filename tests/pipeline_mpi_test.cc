// Pipeline schedules under mpirun -n 4 (one process per device), in one launch: every schedule
// and micro-batch count of meshflow/train/pipeline_test.cc trains to the one-device result on 2
// stages of 2 tensor-parallel devices (uneven shards; AdamW and ZeRO-1 too) and on 4 stages of
// one, holding no more activation sets than the schedule allows. (tests/cli_pipeline_test.py
// checks the order each device ran under mpirun, from its trace.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "meshflow/graph/testing.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

void expect_trains_as_one_device(Schedule schedule, int stages, int tp, int m, bool adamw) {
  SCOPED_TRACE(fmt::format("{} p={} tp={} M={}{}", to_string(schedule), stages, tp, m,
                           adamw ? " adamw zero 1" : ""));
  TrainOptions o{
      .steps = 2,
      .optimizer = adamw ? resolve_optimizer(
                               {.kind = OptimizerKind::kAdamW, .lr = 0.05, .weight_decay = 0.1})
                         : resolve_optimizer({.lr = 0.3}),
      .micro_batches = m,
      .schedule = schedule,
      .zero = adamw ? 1 : 0,
      .check = true};
  o.run.backend = Backend::kMpi;
  o.run.threads_per_device = 1;
  const TrainReport r = train_model(Model{.pcg = testing::stage_mlp(stages, tp, 8, 5)}, o);
  if (r.reporter) {
    ASSERT_TRUE(r.check.has_value());
    EXPECT_LT(r.check->max_loss_diff, 1e-5);
    EXPECT_LT(r.check->max_weight_diff, 1e-5);
    EXPECT_LT(r.check->max_grad_diff, 1e-5);
    for (const StepReport& s : r.steps) EXPECT_TRUE(s.times.bubble.has_value());
  }
  ASSERT_EQ(r.pipeline.size(), 4u);
  for (const LoopEnd::StageDevice& d : r.pipeline)
    EXPECT_LE(d.peak_sets, held_set_limit(schedule, stages, d.stage, m)) << d.device;
}

TEST(MpiPipeline, EveryScheduleTrainsAsOneDevice) {
  for (const auto& [stages, tp] : {std::pair{2, 2}, std::pair{4, 1}}) {
    for (int m : {1, 2, 4, 8}) {
      expect_trains_as_one_device(Schedule::kGpipe, stages, tp, m, false);
      expect_trains_as_one_device(Schedule::k1f1b, stages, tp, m, false);
      if (m >= 2) expect_trains_as_one_device(Schedule::kZb, stages, tp, m, false);
    }
  }
  for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb})
    expect_trains_as_one_device(s, 2, 2, 4, true);
}

}  // namespace
}  // namespace meshflow
