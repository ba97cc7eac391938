// The optimizer of a training run as users give it (DESIGN.md, "Training as users train"):
// `--optimizer sgd|adamw` with its hyperparameters, gradient clipping and the learning-rate
// schedule, from the command line, the model file's "train" object or Python keywords;
// validated, resolved to PyTorch's defaults, and turned into the graph's update rule and each
// step's learning rate.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "meshflow/graph/passes.h"
#include "meshflow/kernels/optimizer.h"
#include "meshflow/train/schedule.h"

namespace meshflow {

enum class LrDecay { kNone, kCosine, kLinear };

// Returns "none", "cosine", "linear"; parses them.
std::string_view to_string(LrDecay decay);
std::optional<LrDecay> parse_lr_decay(std::string_view text);

// The options as given: an unset option was not given (it takes the model file's value, then
// the optimizer's default).
struct OptimizerOptions {
  std::optional<OptimizerKind> kind;
  std::optional<double> lr, momentum, eps, weight_decay, clip_grad_norm;
  std::optional<std::pair<double, double>> betas;
  std::optional<int> warmup_steps, decay_steps;
  std::optional<LrDecay> decay;
  bool operator==(const OptimizerOptions&) const = default;
};

// How errors name an option: as the command line spells it (`--weight-decay`) or as Python's
// keyword (`weight_decay=`).
enum class OptionStyle { kFlag, kKeyword };

// A complete, valid optimizer.
struct Optimizer {
  UpdateRule rule;  // kind, momentum | betas, eps, weight_decay, clip_grad_norm
  double lr = 0.1;
  int warmup_steps = 0;
  LrDecay decay = LrDecay::kNone;
  int decay_steps = 0;  // >= 1 when decay is not none
  bool operator==(const Optimizer&) const = default;
};

// Returns the optimizer `given` describes, each unset option taken from `defaults` (the model
// file's "train" object), then from the optimizer's default (sgd: lr 0.1, momentum 0; adamw:
// lr 0.001, betas 0.9,0.999, eps 1e-8, weight decay 0.01). Throws Error(kInvalidArgument), one
// line naming the option in `style`, when a value is out of its range (--lr finite and >= 0;
// --momentum and each beta in [0, 1); --eps finite and > 0; --weight-decay finite and >= 0;
// --clip-grad-norm finite and > 0; --warmup-steps >= 0; --decay-steps >= 1 and given exactly
// when --decay is not none) or an option belongs to the other optimizer (--momentum with adamw;
// --betas, --eps, --weight-decay with sgd).
Optimizer resolve_optimizer(const OptimizerOptions& given, const OptimizerOptions& defaults = {},
                            OptionStyle style = OptionStyle::kFlag);

// Returns the learning rate of step `step` (1-based over the whole run): lr·t/W for t <= W
// (warmup), then from lr to 0 over the next D steps (cosine: lr·0.5·(1 + cos(π·(t−W)/D));
// linear: lr·(1 − (t−W)/D)), 0 after; lr throughout without warmup or decay.
double learning_rate(const Optimizer& optimizer, int step);

// The defaults a model file's "train" object holds for `train`'s options (unset: not given).
struct TrainDefaults {
  OptimizerOptions optimizer;
  std::optional<int> micro_batches;
  std::optional<int> zero;  // 0, 1 or 3
  std::optional<Schedule> schedule;
  std::optional<Recompute> recompute;
  bool operator==(const TrainDefaults&) const = default;
};

// Returns what a model file's "train" object holds (null: nothing). Its fields are the
// options' names with '_' for '-': "optimizer", "lr", "momentum", "betas" ([b1, b2]), "eps",
// "weight_decay", "clip_grad_norm", "warmup_steps", "decay", "decay_steps", "micro_batches",
// "zero", "schedule", "recompute".
// Throws Error(kInvalidArgument) naming `source` and the field for an unknown field or a value
// of the wrong type or out of its range.
TrainDefaults train_defaults_from_json(const nlohmann::json& train, std::string_view source);

// Returns the ZeRO level: `given` (--zero, zero=) when set, else the model file's, else 0.
// Throws Error(kInvalidArgument) naming the option in `style` when it is not 0, 1 or 3.
int resolve_zero(std::optional<int> given, const TrainDefaults& defaults,
                 OptionStyle style = OptionStyle::kFlag);

// Returns the pipeline schedule and the recomputation policy: `given` (--schedule, schedule=;
// --recompute, recompute=) when set, else the model file's, else 1f1b and none. Throws Error
// naming an unknown name.
Schedule resolve_schedule(const std::optional<std::string>& given, const TrainDefaults& defaults);
Recompute resolve_recompute(const std::optional<std::string>& given, const TrainDefaults& defaults);

// Returns DESIGN's checkpoint "optimizer" object: {"kind", "lr", "momentum" | "betas", "eps",
// "weight_decay", "clip_grad_norm" (null: none), "warmup_steps", "decay", "decay_steps"}.
nlohmann::json to_json(const Optimizer& optimizer);

}  // namespace meshflow
