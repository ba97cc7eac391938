// The cases of pipeline_bench.h.
#include "bench/pipeline_bench.h"

#include <fmt/format.h>

#include <map>

#include "bench/collectives_bench.h"
#include "meshflow/train/trainer.h"

namespace meshflow::bench {

namespace {

constexpr int kStages = 2;
constexpr int kLayersPerStage = 2;

// The MLP: x plus a trainable shift, then per stage two layers h = tanh(linear(h, w)) of width x
// width, then o = linear(h, w_out) and loss = mse(o, t) on the last stage. Stage s on
// `meshes[s]`.
Model mlp(const std::vector<DeviceMesh>& meshes, std::int64_t batch, std::int64_t width) {
  Pcg g;
  auto R = [] { return std::vector<Placement>{Placement::replicate()}; };
  const ValueId x = add_input(g, "x", {{batch, width}}, meshes.front(), R(), Source::normal(1, 51));
  // A trainable shift of the input: the first layer computes its input's gradient too, so both
  // stages' backwards make the same four products.
  const ValueId shift =
      add_weight(g, "shift", {{width}}, meshes.front(), R(), Source::normal(0.1, 50));
  ValueId h = add_compute(g, "shifted", Op{.type = OpType::kAdd}, {x, shift});
  const ValueId t = add_input(g, "t", {{batch, 16}}, meshes.back(), R(), Source::normal(1, 52));
  for (int s = 0; s < kStages; ++s) {
    for (int l = 0; l < kLayersPerStage; ++l) {
      const int k = s * kLayersPerStage + l;
      const ValueId w = add_weight(g, fmt::format("w{}", k), {{width, width}},
                                   meshes[static_cast<std::size_t>(s)], R(),
                                   Source::normal(0.03, static_cast<std::uint64_t>(60 + k)));
      const ValueId y = add_compute(g, fmt::format("l{}", k), Op{.type = OpType::kLinear}, {h, w},
                                    meshes[static_cast<std::size_t>(s)]);
      h = add_compute(g, fmt::format("h{}", k), Op{.type = OpType::kTanh}, {y});
    }
  }
  const ValueId w =
      add_weight(g, "w_out", {{width, 16}}, meshes.back(), R(), Source::normal(0.03, 59));
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {h, w}, meshes.back());
  const ValueId loss = add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t});
  set_loss(g, loss);
  add_output(g, loss);
  return Model{.pcg = std::move(g)};
}

TrainOptions options(Schedule s, int micro_batches, int reps) {
  TrainOptions o{.steps = 1 + reps,
                 .optimizer = resolve_optimizer({.lr = 0.01}),
                 .micro_batches = micro_batches,
                 .schedule = s};
  o.run.threads_per_device = 1;
  return o;
}

// Trains `model` for 1 + reps steps; returns the timed steps' reports and the stage peaks.
TrainReport train(const Model& model, Schedule s, int micro_batches, int reps) {
  TrainReport r = train_model(model, options(s, micro_batches, reps));
  r.steps.erase(r.steps.begin());
  return r;
}

// explain's estimate of the step's bubble (the schedule simulated with the default machine's
// group times).
double estimated_bubble(const Model& model, Schedule s, int micro_batches) {
  const TrainOptions o = options(s, micro_batches, 0);
  const std::optional<ScheduleExplanation> e = explain_model_schedule(
      model, o.run, {.update = o.optimizer.rule, .micro_batches = micro_batches}, s);
  return e ? e->est_bubble : 0.0;
}

}  // namespace

BenchReport run_pipeline_bench(const PipelineBenchOptions& options) {
  BenchReport report{.benchmark = "pipeline", .progress = options.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const Model staged =
      mlp({make_mesh({1}, {0}), make_mesh({1}, {1})}, options.batch, options.width);
  const Model one = mlp({make_mesh({1}, {0}), make_mesh({1}, {0})}, options.batch, options.width);
  const std::int64_t bytes = options.batch * options.width * 4;
  for (int m : {1, 2, 4, 8}) {
    // The one-device step at this M, interleaved with the schedules' runs below.
    std::vector<double> ideal;
    for (const StepReport& s : train(one, Schedule::k1f1b, m, options.reps).steps)
      ideal.push_back(s.seconds / kStages * (m + kStages - 1) / m);
    for (Schedule schedule : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb}) {
      if (schedule == Schedule::kZb && m < 2) continue;
      const TrainReport r = train(staged, schedule, m, options.reps);
      BenchResult result{.case_name = fmt::format("{} M={}", to_string(schedule), m),
                         .backend = "threads",
                         .mesh = "1@0 | 1@1",
                         .devices = kStages,
                         .bytes = bytes};
      std::vector<double> bubbles;
      for (const StepReport& s : r.steps) {
        result.case_s.push_back(s.seconds);
        bubbles.push_back(s.times.bubble.value_or(0));
      }
      result.baseline = "ideal";
      result.baseline_s = ideal;
      std::vector<std::int64_t> peaks(kStages, 0);
      for (const LoopEnd::StageDevice& d : r.pipeline)
        peaks[static_cast<std::size_t>(d.stage)] =
            std::max(peaks[static_cast<std::size_t>(d.stage)], d.peak_set_bytes);
      result.extra["schedule"] = std::string(to_string(schedule));
      result.extra["micro_batches"] = m;
      result.extra["bubble"] = median(bubbles);
      result.extra["bubble_theory"] = theory_bubble(schedule, kStages, m);
      result.extra["est_bubble"] = estimated_bubble(staged, schedule, m);
      result.extra["median_s"] = median(result.case_s);
      result.extra["vs_ideal"] = median(result.case_s) / median(ideal);
      result.extra["peak_activation_bytes"] = peaks;
      add_result(report, std::move(result));
    }
  }
  return report;
}

}  // namespace meshflow::bench
