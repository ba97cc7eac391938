// The step loop over the runtime's launch (runtime/model_runner.h), and the one-device check.
#include "meshflow/train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/reference.h"
#include "meshflow/mesh/folder_io.h"
#include "meshflow/train/checkpoint.h"
#include "meshflow/train/metrics.h"
#include "meshflow/train/reference_optimizer.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// Why a step stops training; the loop reduces every device's by max.
enum StopFlag : int { kGoOn = 0, kNonfiniteNorm = 1, kNonfiniteLoss = 2 };

// What the one-device check needs of a run with data: its data, where its rows start, and the
// evaluations it ran.
struct CheckData {
  const ModelData* data = nullptr;
  DataPosition start;
  const std::vector<EvalReport>* evals = nullptr;
};

// Returns the reference's mean loss over `batches` val batches at its current weights.
double reference_val_loss(ReferenceModel& ref, const Model& model, GlobalBatches& data,
                          int batches) {
  double total = 0;
  for (int b = 1; b <= batches; ++b) {
    for (auto& [name, t] : data.at(b, /*val=*/true))
      ref.values[static_cast<std::size_t>(find_value(model.pcg, name))] = std::move(t);
    reference_forward(ref);
    total += scalar_of(ref.values[static_cast<std::size_t>(*model.pcg.loss)]);
  }
  return total / batches;
}

CheckReport check_against_one_device(const Model& model, const TrainOptions& options,
                                     const PreparedModel& p,
                                     const std::vector<std::vector<Tensor>>& grads,
                                     const std::vector<std::vector<Tensor>>& weights,
                                     const std::vector<StepReport>& steps,
                                     const Checkpoint* resumed, const CheckData& data) {
  CheckReport c;
  // A resumed run's reference starts from the same checkpoint: its weights, and its optimizer
  // state in float64.
  Pcg start = model.pcg;
  if (resumed) {
    for (Node& n : start.nodes) {
      if (n.kind == NodeKind::kWeight)
        n.source = Source{.kind = Source::Kind::kFolder, .path = resumed->path / n.name};
    }
  }
  ReferenceModel ref = reference_load(start);
  ReferenceOptimizer optimizer{.optimizer = options.optimizer};
  if (resumed) {
    for (const auto& [name, v] : p.weights) {
      std::vector<std::vector<double>>& state = optimizer.state[name];
      for (const std::string& s : state_names(options.optimizer.rule)) {
        const CheckpointTensor& t = resumed->tensors.at(name + "." + s);
        const Tensor whole =
            read_folder_box(resumed->path / (name + "." + s), t.layout, full_box(t.layout.shape));
        std::vector<double> d(static_cast<std::size_t>(whole.numel()));
        visit_dtype(whole.dtype(), [&](auto zero) {
          const auto x = whole.data<decltype(zero)>();
          for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(x[i]);
        });
        state.push_back(std::move(d));
      }
    }
  }
  std::map<std::string, Tensor*> ref_weights;
  for (const auto& [name, v] : p.weights)
    ref_weights[name] = &ref.values[static_cast<std::size_t>(find_value(model.pcg, name))];
  std::size_t next_eval = 0;
  std::optional<GlobalBatches> batches;
  if (data.data) batches.emplace(*data.data, data.start);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    if (batches) {
      for (auto& [name, t] : batches->at(steps[s].step, /*val=*/false))
        ref.values[static_cast<std::size_t>(find_value(model.pcg, name))] = std::move(t);
    }
    reference_forward(ref);
    const double loss = scalar_of(ref.values[static_cast<std::size_t>(*model.pcg.loss)]);
    c.max_loss_diff = std::max(c.max_loss_diff, std::abs(loss - steps[s].loss));
    std::map<std::string, Tensor> g = reference_gradients(ref);
    for (std::size_t i = 0; i < p.grads.size(); ++i)
      c.max_grad_diff =
          std::max(c.max_grad_diff, max_abs_difference(grads[s][i], g.at(p.grads[i].first)));
    reference_step(optimizer, ref_weights, g, steps[s].step, loss);
    for (std::size_t i = 0; i < p.weights.size(); ++i) {
      c.max_weight_diff =
          std::max(c.max_weight_diff,
                   max_abs_difference(weights[s][i], *ref_weights.at(p.weights[i].first)));
    }
    while (data.evals && next_eval < data.evals->size() &&
           (*data.evals)[next_eval].step == steps[s].step) {
      const double val = reference_val_loss(ref, model, *batches, options.eval_batches);
      c.max_val_loss_diff = std::max(c.max_val_loss_diff.value_or(0.0),
                                     std::abs(val - (*data.evals)[next_eval].val_loss));
      ++next_eval;
    }
  }
  return c;
}

}  // namespace

std::function<std::vector<std::vector<ScheduledGroup>>(int, int)> schedule_of(Schedule s) {
  return [s](int stages, int micro_batches) { return pipeline_orders(s, stages, micro_batches); };
}

TrainReport train_model(const Model& model, const TrainOptions& options) {
  std::string error;
  std::optional<PreparedModel> p =
      try_prepare(model, Mode::kTrain, options.run, error,
                  {.update = options.optimizer.rule,
                   .micro_batches = options.micro_batches,
                   .zero = options.zero,
                   .recompute = options.recompute,
                   .fetch_training_values = options.check,
                   .schedule = schedule_of(options.schedule),
                   .split_weights = options.schedule == Schedule::kZb});
  // A resumed run loads every weight and state tensor from the checkpoint, in the model's own
  // layouts, after checking the checkpoint holds exactly them.
  std::optional<Checkpoint> resumed;
  if (p && options.resume) {
    try {
      resumed = read_checkpoint(resume_path(*options.resume));
      std::map<std::string, TensorSpec> expected;
      for (const Node& n : p->pcg.nodes)
        if (n.kind == NodeKind::kWeight || n.kind == NodeKind::kState) expected[n.name] = n.spec;
      check_checkpoint_matches(*resumed, expected, options.optimizer.rule.kind);
      for (Node& n : p->pcg.nodes) {
        if (n.kind == NodeKind::kWeight || n.kind == NodeKind::kState)
          n.source = Source{.kind = Source::Kind::kProvided};
      }
    } catch (const Error& e) {
      if (options.run.backend != Backend::kMpi) throw;
      error = e.what();
      p.reset();
    }
  }
  const int first_step = resumed ? resumed->step + 1 : 1;
  const int last_step = first_step + options.steps - 1;
  // The model's data (checked before any step), where its rows start, and its feeder.
  std::optional<ModelData> data;
  DataPosition position;
  std::optional<DataFeeder> feeder;
  std::optional<MetricsLog> metrics;
  try {
    data = read_model_data(model);
    if (options.eval_every > 0 && (!data || !data->spec.val)) {
      fail(ErrorKind::kInvalidArgument,
           "--eval-every {}: the model has no val split to evaluate on (\"data\": {{\"val\": "
           "...}})",
           options.eval_every);
    }
    if (data && resumed)
      position = resumed_position(*data, resumed->data, resumed->step, resumed->path.string());
    if (p && data) feeder.emplace(*data, *p, position, last_step);
    if (options.log_dir && reports(options.run)) metrics.emplace(*options.log_dir);
  } catch (const Error& e) {
    if (options.run.backend != Backend::kMpi) throw;
    error = e.what();
    p.reset();
    feeder.reset();
  }
  // The global batch's rows B and, for windows, tokens per row S (samples/s and tokens/s).
  std::int64_t batch_rows = 0, row_tokens = 0;
  if (data) {
    batch_rows = data->batch;
    if (data->windows()) row_tokens = window_of(data->inputs);
  } else {
    for (const Node& n : model.pcg.nodes) {
      if (n.kind == NodeKind::kInput && !n.spec.shape.empty() && n.batch) {
        batch_rows = n.spec.shape[0];
        break;
      }
    }
  }
  TrainReport report;
  // Per step, the fetched gradients and weights (check only).
  std::vector<std::vector<Tensor>> grads, weights;
  StepLoop loop{.steps = options.steps, .first_step = first_step};
  CheckpointLoadArea area;
  // Each device's background checkpoint writer, and the time the leader's last step was held by
  // its checkpoint (set and read on the leader's thread).
  std::mutex writers_mu;
  std::map<DeviceId, std::unique_ptr<CheckpointWriter>> writers;
  double leader_pause = 0;
  if (p && resumed) {
    // Every weight and state tensor from the checkpoint, each file verified once (a damaged one
    // stops every device before the first step, naming the checkpoint to resume instead).
    std::vector<ValueId> provided;
    std::vector<LoadTarget> targets;
    for (ValueId v = 0; v < static_cast<ValueId>(p->pcg.nodes.size()); ++v) {
      const Node& n = p->pcg.nodes[static_cast<std::size_t>(v)];
      if (n.source.kind != Source::Kind::kProvided) continue;
      provided.push_back(v);
      targets.push_back({n.name, *n.layout});
    }
    loop.after_load = [&, provided, targets](Communicator& world, std::vector<Tensor>& values) {
      std::vector<Tensor> shards;
      try {
        shards = load_checkpoint(world, *resumed, targets, &area);
      } catch (const Error& e) {
        std::string line = e.what();
        for (const fs::path& older : complete_checkpoints(resumed->path.parent_path())) {
          if (read_checkpoint(older).step < resumed->step)
            line = fmt::format("{} (resume from {} instead)", e.what(), older.string());
        }
        throw Error(e.kind(), line, ErrorScope::kEveryDevice);
      }
      for (std::size_t i = 0; i < provided.size(); ++i)
        values[static_cast<std::size_t>(provided[i])] = std::move(shards[i]);
    };
  }
  if (p && options.checkpoint) {
    std::vector<ValueId> saved;
    for (ValueId v = 0; v < static_cast<ValueId>(p->pcg.nodes.size()); ++v) {
      const NodeKind k = p->pcg.nodes[static_cast<std::size_t>(v)].kind;
      if (k == NodeKind::kWeight || k == NodeKind::kState) saved.push_back(v);
    }
    const int last = last_step;
    loop.after_step = [&, saved, last](int step, Communicator& world,
                                       const std::vector<Tensor>& values) {
      CheckpointWriter* writer = nullptr;
      {
        std::lock_guard lock(writers_mu);
        auto& slot = writers[world.device()];
        if (!slot) slot = std::make_unique<CheckpointWriter>(p->leader, *options.checkpoint);
        writer = slot.get();
      }
      const int every = options.checkpoint->every;
      double held = 0;
      if (step == last || (every > 0 && step % every == 0)) {
        std::vector<SavedTensor> tensors;
        for (ValueId v : saved) {
          const Node& n = p->pcg.nodes[static_cast<std::size_t>(v)];
          const bool on = find_device(n.layout->mesh, world.device()).has_value();
          tensors.push_back(
              {n.name, *n.layout, on ? &values[static_cast<std::size_t>(v)] : nullptr});
        }
        held += writer->start(world, step, to_json(options.optimizer), tensors,
                              data ? data_position_json(*data, position, step) : nlohmann::json());
      } else {
        held += writer->poll(world, /*wait=*/false);
      }
      // train returns once the last checkpoint is committed.
      if (step == last) held += writer->poll(world, /*wait=*/true, /*last=*/true);
      if (world.device() == p->leader) leader_pause = held;
    };
    // The snapshot's buffers, held from the first checkpoint on, count in measured_memory.
    loop.held_beside = [&](DeviceId device) -> std::int64_t {
      std::lock_guard lock(writers_mu);
      auto it = writers.find(device);
      return it == writers.end() ? 0 : it->second->snapshot_bytes();
    };
  }
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
    if (feeder) {
      loop.feed = feeder->feed();
      if (options.eval_every > 0) {
        loop.eval_at = [&](int step) {
          return step % options.eval_every == 0 || step == last_step;
        };
        loop.eval_batches = options.eval_batches;
        loop.eval_feed = feeder->eval_feed();
        loop.on_eval = [&](int step, double loss) {
          report.evals.push_back({.step = step, .val_loss = loss});
          if (metrics) {
            metrics->append(to_json(report.evals.back()));
            metrics->write_plot();
          }
          if (options.on_eval) options.on_eval(report.evals.back());
        };
      }
    }
    loop.on_step = [&](int step, double seconds, const TaskTimes& times,
                       const std::vector<Tensor>& values) {
      StepReport r{.step = step,
                   .loss = scalar_of(at(values, *p->loss)),
                   .seconds = seconds,
                   .times = times,
                   .lr = learning_rate(options.optimizer, step),
                   .grad_norm = times.grad_norm,
                   .samples_per_s = seconds > 0 ? static_cast<double>(batch_rows) / seconds : 0};
      if (row_tokens > 0 && seconds > 0)
        r.tokens_per_s = static_cast<double>(batch_rows * row_tokens) / seconds;
      if (!report.evals.empty()) r.last_val_loss = report.evals.back().val_loss;
      if (options.checkpoint) r.checkpoint_pause_s = std::exchange(leader_pause, 0.0);
      if (metrics) metrics->append(to_json(r));
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
  if (metrics) metrics->write_plot();
  report.reporter = reports(options.run);
  report.measured = end.measured;
  report.pipeline = end.pipeline;
  if (end.stop_flag != kGoOn) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("step {}: {} is not finite; training stopped before its update and "
                    "wrote nothing (--allow-nonfinite trains on)",
                    end.step,
                    end.stop_flag == kNonfiniteLoss ? "the loss" : "the global gradient norm"),
        ErrorScope::kEveryDevice);
  }
  if (options.check && report.reporter) {
    report.check = check_against_one_device(
        model, options, *p, grads, weights, report.steps, resumed ? &*resumed : nullptr,
        {.data = data ? &*data : nullptr, .start = position, .evals = &report.evals});
    for (std::size_t s = 0; s < grads.size(); ++s) {
      std::map<std::string, Tensor>& g = report.check->grads.emplace_back();
      std::map<std::string, Tensor>& w = report.check->weights.emplace_back();
      for (std::size_t i = 0; i < p->grads.size(); ++i)
        g[p->grads[i].first] = std::move(grads[s][i]);
      for (std::size_t i = 0; i < p->weights.size(); ++i)
        w[p->weights[i].first] = std::move(weights[s][i]);
    }
  }
  return report;
}

namespace {

// Returns `v` as JSON, null where it is missing or not finite.
nlohmann::json number(std::optional<double> v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

nlohmann::json to_json(const EvalReport& e) {
  return {{"step", e.step}, {"val_loss", number(e.val_loss)}};
}

nlohmann::json to_json(const StepReport& s) {
  return {{"step", s.step},
          {"loss", number(s.loss)},
          {"seconds", s.seconds},
          {"bubble", number(s.times.bubble)},
          {"lr", s.lr},
          {"grad_norm", number(s.grad_norm)},
          {"data_wait_s", number(s.times.data_wait_s)},
          {"samples_per_s", s.samples_per_s},
          {"tokens_per_s", number(s.tokens_per_s)},
          {"checkpoint_pause_s", number(s.checkpoint_pause_s)}};
}

nlohmann::json to_json(const TrainReport& report) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepReport& s : report.steps) steps.push_back(to_json(s));
  nlohmann::json evals = nlohmann::json::array();
  for (const EvalReport& e : report.evals) evals.push_back(to_json(e));
  nlohmann::json check = nullptr;
  if (report.check) {
    check = {{"max_loss_diff", report.check->max_loss_diff},
             {"max_weight_diff", report.check->max_weight_diff},
             {"max_grad_diff", report.check->max_grad_diff}};
    // Only where evaluations ran.
    if (report.check->max_val_loss_diff)
      check["max_val_loss_diff"] = *report.check->max_val_loss_diff;
  }
  return {{"steps", steps},
          {"evals", evals},
          {"check", check},
          {"measured_peak_bytes", report.measured.peak},
          {"measured_memory", to_json(report.measured.at_peak)}};
}

}  // namespace meshflow
