// The step loop over the runtime's launch (runtime/model_runner.h), and the one-device check.
#include "meshflow/train/trainer.h"

#include <fmt/format.h>

#include <cmath>

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/reference.h"
#include "meshflow/train/reference_optimizer.h"

namespace meshflow {

namespace {

// Why a step stops training; the loop reduces every device's by max.
enum StopFlag : int { kGoOn = 0, kNonfiniteNorm = 1, kNonfiniteLoss = 2 };

CheckReport check_against_one_device(const Model& model, const TrainOptions& options,
                                     const PreparedModel& p,
                                     const std::vector<std::vector<Tensor>>& grads,
                                     const std::vector<std::vector<Tensor>>& weights,
                                     const std::vector<StepReport>& steps) {
  CheckReport c;
  ReferenceModel ref = reference_load(model.pcg);
  ReferenceOptimizer optimizer{.optimizer = options.optimizer};
  std::map<std::string, Tensor*> ref_weights;
  for (const auto& [name, v] : p.weights)
    ref_weights[name] = &ref.values[static_cast<std::size_t>(find_value(model.pcg, name))];
  for (std::size_t s = 0; s < steps.size(); ++s) {
    reference_forward(ref);
    const double loss = scalar_of(ref.values[static_cast<std::size_t>(*model.pcg.loss)]);
    c.max_loss_diff = std::max(c.max_loss_diff, std::abs(loss - steps[s].loss));
    std::map<std::string, Tensor> g = reference_gradients(ref);
    for (std::size_t i = 0; i < p.grads.size(); ++i)
      c.max_grad_diff =
          std::max(c.max_grad_diff, max_abs_difference(grads[s][i], g.at(p.grads[i].first)));
    reference_step(optimizer, ref_weights, g, static_cast<int>(s) + 1, loss);
    for (std::size_t i = 0; i < p.weights.size(); ++i) {
      c.max_weight_diff =
          std::max(c.max_weight_diff,
                   max_abs_difference(weights[s][i], *ref_weights.at(p.weights[i].first)));
    }
  }
  return c;
}

}  // namespace

TrainReport train_model(const Model& model, const TrainOptions& options) {
  std::string error;
  std::optional<PreparedModel> p = try_prepare(model, Mode::kTrain, options.run, error,
                                               {.update = options.optimizer.rule,
                                                .micro_batches = options.micro_batches,
                                                .zero = options.zero,
                                                .fetch_training_values = options.check});
  TrainReport report;
  // Per step, the fetched gradients and weights (check only).
  std::vector<std::vector<Tensor>> grads, weights;
  StepLoop loop{.steps = options.steps};
  loop.options = [&](int step) {
    return TaskRunOptions{.lr = learning_rate(options.optimizer, step),
                          .step = step,
                          .allow_nonfinite = options.allow_nonfinite};
  };
  if (p) {
    auto at = [](const std::vector<Tensor>& values, ValueId v) -> const Tensor& {
      return values[static_cast<std::size_t>(v)];
    };
    loop.stop_flag = [&](const std::vector<Tensor>& values, bool leader) -> int {
      if (options.allow_nonfinite) return kGoOn;
      if (leader && !std::isfinite(scalar_of(at(values, *p->loss)))) return kNonfiniteLoss;
      // Devices outside the norm's mesh hold no copy of it.
      if (p->grad_norm && at(values, *p->grad_norm).numel() == 1 &&
          !std::isfinite(scalar_of(at(values, *p->grad_norm))))
        return kNonfiniteNorm;
      return kGoOn;
    };
    loop.on_step = [&](int step, double seconds, const TaskTimes& times,
                       const std::vector<Tensor>& values) {
      StepReport r{.step = step,
                   .loss = scalar_of(at(values, *p->loss)),
                   .seconds = seconds,
                   .times = times};
      report.steps.push_back(r);
      if (options.check) {
        grads.emplace_back();
        weights.emplace_back();
        for (const auto& [name, v] : p->grads) grads.back().push_back(at(values, v).clone());
        for (const auto& [name, v] : p->weights) weights.back().push_back(at(values, v).clone());
      }
      if (options.progress) options.progress(r);
    };
  }
  const LoopEnd end = run_loop(p ? &*p : nullptr, error, options.run, loop);
  report.reporter = reports(options.run);
  report.measured = end.measured;
  if (end.stop_flag != kGoOn) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("step {}: {} is not finite; training stopped before its update and "
                    "wrote nothing (--allow-nonfinite trains on)",
                    end.step,
                    end.stop_flag == kNonfiniteLoss ? "the loss" : "the global gradient norm"),
        ErrorScope::kEveryDevice);
  }
  if (options.check && report.reporter)
    report.check = check_against_one_device(model, options, *p, grads, weights, report.steps);
  return report;
}

nlohmann::json to_json(const TrainReport& report) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepReport& s : report.steps) {
    steps.push_back({{"step", s.step},
                     {"loss", std::isfinite(s.loss) ? nlohmann::json(s.loss) : nlohmann::json()},
                     {"seconds", s.seconds}});
  }
  nlohmann::json check = nullptr;
  if (report.check) {
    check = {{"max_loss_diff", report.check->max_loss_diff},
             {"max_weight_diff", report.check->max_weight_diff},
             {"max_grad_diff", report.check->max_grad_diff}};
  }
  return {{"steps", steps},
          {"check", check},
          {"measured_peak_bytes", report.measured.peak},
          {"measured_memory", to_json(report.measured.at_peak)}};
}

}  // namespace meshflow
