// Pipeline schedules run (DESIGN's "Pipeline schedules"): every schedule trains as one device
// does, on 2 and 4 stages, with tensor parallelism inside stages (uneven shards), AdamW and
// ZeRO-1; each stage ran its schedule's groups (the trace's F/B/W events), holding no more
// activation sets than the schedule allows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "meshflow/graph/testing.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

struct Case {
  Schedule schedule;
  int stages, tp, micro_batches, zero = 0;
  bool adamw = false;
};

std::string name(const Case& c) {
  return fmt::format("{} p={} tp={} M={} zero={}{}", to_string(c.schedule), c.stages, c.tp,
                     c.micro_batches, c.zero, c.adamw ? " adamw" : "");
}

// Returns each device's groups of step `step` in the order they ran, from the trace.
std::map<int, std::string> groups_ran(const fs::path& trace, int step) {
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::vector<std::pair<double, std::string>>> by_device;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("cat", "") != "group" || e["args"]["step"] != step) continue;
    by_device[e["pid"].get<int>()].emplace_back(e["ts"].get<double>(), e["name"]);
  }
  std::map<int, std::string> out;
  for (auto& [d, events] : by_device) {
    std::sort(events.begin(), events.end());
    for (const auto& [ts, n] : events) out[d] += (out[d].empty() ? "" : " ") + n;
  }
  return out;
}

void expect_trains_as_one_device(const Case& c) {
  SCOPED_TRACE(name(c));
  const fs::path trace =
      fs::temp_directory_path() / fmt::format("meshflow_pipeline_{}.json", ::getpid());
  const Model model{.pcg = testing::stage_mlp(c.stages, c.tp, 8, 5)};
  TrainOptions o{
      .steps = 2,
      .optimizer = c.adamw ? resolve_optimizer(
                                 {.kind = OptimizerKind::kAdamW, .lr = 0.05, .weight_decay = 0.1})
                           : resolve_optimizer({.lr = 0.3}),
      .micro_batches = c.micro_batches,
      .schedule = c.schedule,
      .zero = c.zero,
      .check = true};
  o.run.trace = trace;
  o.run.threads_per_device = 1;
  const TrainReport r = train_model(model, o);
  ASSERT_TRUE(r.check.has_value());
  EXPECT_LT(r.check->max_loss_diff, 1e-5);
  EXPECT_LT(r.check->max_weight_diff, 1e-5);
  EXPECT_LT(r.check->max_grad_diff, 1e-5);
  for (const StepReport& s : r.steps) {
    ASSERT_TRUE(s.times.bubble.has_value());
    EXPECT_GE(*s.times.bubble, 0);
    EXPECT_LT(*s.times.bubble, 1);
  }
  // Each device ran its stage's order (gpipe, 1f1b: exactly; zb: the schedule's, whose rules
  // schedule_test checks) and held no more activation sets than allowed.
  const auto orders = pipeline_orders(c.schedule, c.stages, c.micro_batches);
  const std::map<int, std::string> ran = groups_ran(trace, 2);
  ASSERT_EQ(ran.size(), static_cast<std::size_t>(c.stages * c.tp));
  for (const auto& [device, text] : ran)
    EXPECT_EQ(text, to_text(orders[static_cast<std::size_t>(device / c.tp)])) << device;
  ASSERT_EQ(r.pipeline.size(), static_cast<std::size_t>(c.stages * c.tp));
  for (const LoopEnd::StageDevice& d : r.pipeline) {
    EXPECT_EQ(d.stage, d.device / c.tp);
    EXPECT_LE(d.peak_sets, held_set_limit(c.schedule, c.stages, d.stage, c.micro_batches))
        << d.device;
    EXPECT_GE(d.peak_sets, 1);
  }
  fs::remove(trace);
}

TEST(Pipeline, EverySchedulesTrainsAsOneDeviceOnTwoAndFourStages) {
  for (int p : {2, 4}) {
    for (int M : {1, 2, 4, 8}) {
      expect_trains_as_one_device({Schedule::kGpipe, p, 1, M});
      expect_trains_as_one_device({Schedule::k1f1b, p, 1, M});
      if (M >= 2) expect_trains_as_one_device({Schedule::kZb, p, 1, M});
    }
  }
}

// Two stages of two devices each, weights column-parallel over 5 columns (shards of 3 and 2),
// with AdamW and ZeRO-1 inside the stages.
TEST(Pipeline, TensorParallelStagesWithAdamwAndZeroOne) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb}) {
    expect_trains_as_one_device({s, 2, 2, 4});
    expect_trains_as_one_device({s, 2, 2, 4, /*zero=*/1, /*adamw=*/true});
  }
}

// GPipe holds every micro-batch's activations at once; 1F1B at most p - s of them.
TEST(Pipeline, OneFOneBHoldsFewerActivationSetsThanGpipe) {
  const Model model{.pcg = testing::stage_mlp(2, 1, 16, 64)};
  std::map<Schedule, std::vector<LoopEnd::StageDevice>> peaks;
  for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b}) {
    TrainOptions o{.micro_batches = 8, .schedule = s};
    peaks[s] = train_model(model, o).pipeline;
  }
  EXPECT_EQ(peaks[Schedule::kGpipe][0].peak_sets, 8);
  EXPECT_EQ(peaks[Schedule::k1f1b][0].peak_sets, 2);
  EXPECT_EQ(peaks[Schedule::k1f1b][1].peak_sets, 1);
  // One micro-batch's activations on stage 0, from GPipe's eight.
  const std::int64_t one = peaks[Schedule::kGpipe][0].peak_set_bytes / 8;
  EXPECT_LE(peaks[Schedule::k1f1b][0].peak_set_bytes,
            peaks[Schedule::kGpipe][0].peak_set_bytes * 2 / 8 + one);
}

// ZB-H1's accounting: a stage holds at most one micro-batch's set more than 1F1B's, at
// M = 2, 4 and 8 on 2 and 4 stages (the values a W still reads counted where they are held).
TEST(Pipeline, ZeroBubbleHoldsAtMostOneSetMoreThanOneFOneB) {
  for (int p : {2, 4}) {
    const Model model{.pcg = testing::stage_mlp(p, 1, 16, 64)};
    for (int M : {2, 4, 8}) {
      std::map<Schedule, std::vector<LoopEnd::StageDevice>> peaks;
      for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb})
        peaks[s] = train_model(model, {.micro_batches = M, .schedule = s}).pipeline;
      for (std::size_t d = 0; d < peaks[Schedule::kZb].size(); ++d) {
        const std::int64_t one = peaks[Schedule::kGpipe][d].peak_set_bytes / M;
        EXPECT_LE(peaks[Schedule::kZb][d].peak_set_bytes,
                  peaks[Schedule::k1f1b][d].peak_set_bytes + one)
            << "p " << p << " M " << M << " stage " << d;
      }
    }
  }
}

}  // namespace
}  // namespace meshflow
