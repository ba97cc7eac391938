// Optimizer options: range checks shared by every way of giving them, the merge with the model
// file's defaults, and the learning-rate schedule.
#include "meshflow/train/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>

#include "meshflow/core/error.h"
#include "meshflow/core/json_field.h"

namespace meshflow {

namespace {

// An option's name as a message shows it, from its command-line spelling ("weight-decay").
using Namer = std::function<std::string(std::string_view flag)>;

// Returns the option's name as Python keywords and model-file fields spell it ("weight_decay").
std::string underscored(std::string_view flag) {
  std::string k(flag);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

Namer namer(OptionStyle style) {
  if (style == OptionStyle::kFlag) return [](std::string_view f) { return fmt::format("--{}", f); };
  return [](std::string_view f) { return underscored(f) + "="; };
}

[[noreturn]] void reject(const Namer& name, std::string_view flag, std::string_view value,
                         std::string_view rule) {
  fail(ErrorKind::kInvalidArgument, "{} {}: {}", name(flag), value, rule);
}

// Throws naming the first option of `o` outside its range.
void check_ranges(const OptimizerOptions& o, const Namer& name) {
  auto number = [&](const std::optional<double>& v, std::string_view flag, bool ok,
                    std::string_view rule) {
    if (v && !ok) reject(name, flag, fmt::format("{}", *v), rule);
  };
  auto finite = [](const std::optional<double>& v) { return v && std::isfinite(*v); };
  auto unit = [](double x) { return x >= 0 && x < 1; };  // false for nan
  number(o.lr, "lr", finite(o.lr) && *o.lr >= 0, "must be finite and >= 0");
  number(o.momentum, "momentum", o.momentum && unit(*o.momentum), "must be in [0, 1)");
  if (o.betas && !(unit(o.betas->first) && unit(o.betas->second))) {
    reject(name, "betas", fmt::format("{},{}", o.betas->first, o.betas->second),
           "each beta must be in [0, 1)");
  }
  number(o.eps, "eps", finite(o.eps) && *o.eps > 0, "must be finite and > 0");
  number(o.weight_decay, "weight-decay", finite(o.weight_decay) && *o.weight_decay >= 0,
         "must be finite and >= 0");
  number(o.clip_grad_norm, "clip-grad-norm", finite(o.clip_grad_norm) && *o.clip_grad_norm > 0,
         "must be finite and > 0");
  if (o.warmup_steps && *o.warmup_steps < 0)
    reject(name, "warmup-steps", std::to_string(*o.warmup_steps), "must be >= 0");
  if (o.decay_steps && *o.decay_steps < 1)
    reject(name, "decay-steps", std::to_string(*o.decay_steps), "must be >= 1");
}

template <typename T>
std::optional<T> either(const std::optional<T>& given, const std::optional<T>& fallback) {
  return given ? given : fallback;
}

}  // namespace

std::string_view to_string(LrDecay decay) {
  switch (decay) {
    case LrDecay::kNone:
      return "none";
    case LrDecay::kCosine:
      return "cosine";
    case LrDecay::kLinear:
      return "linear";
  }
  return "?";
}

std::optional<LrDecay> parse_lr_decay(std::string_view text) {
  for (LrDecay d : {LrDecay::kNone, LrDecay::kCosine, LrDecay::kLinear})
    if (text == to_string(d)) return d;
  return std::nullopt;
}

Optimizer resolve_optimizer(const OptimizerOptions& given, const OptimizerOptions& defaults,
                            OptionStyle style) {
  const Namer name = namer(style);
  check_ranges(given, name);
  check_ranges(defaults, name);
  // An option of the other optimizer is an error where the user gave it; one the model file
  // gives for another optimizer than the one chosen is an error too (it would be ignored).
  const OptimizerKind kind = given.kind.value_or(defaults.kind.value_or(OptimizerKind::kSgd));
  for (const OptimizerOptions* o : {&given, &defaults}) {
    auto other = [&](bool set, std::string_view flag) {
      if (set) {
        fail(ErrorKind::kInvalidArgument, "{} is not an option of --optimizer {}{}", name(flag),
             to_string(kind), o == &defaults ? " (it comes from the model file's \"train\")" : "");
      }
    };
    if (kind == OptimizerKind::kAdamW) other(o->momentum.has_value(), "momentum");
    if (kind == OptimizerKind::kSgd) {
      other(o->betas.has_value(), "betas");
      other(o->eps.has_value(), "eps");
      other(o->weight_decay.has_value(), "weight-decay");
    }
  }
  Optimizer r;
  r.rule.kind = kind;
  const bool adamw = kind == OptimizerKind::kAdamW;
  r.lr = either(given.lr, defaults.lr).value_or(adamw ? 0.001 : 0.1);
  r.rule.momentum = either(given.momentum, defaults.momentum).value_or(0);
  const auto betas = either(given.betas, defaults.betas).value_or(std::pair{0.9, 0.999});
  r.rule.beta1 = betas.first;
  r.rule.beta2 = betas.second;
  r.rule.eps = either(given.eps, defaults.eps).value_or(1e-8);
  r.rule.weight_decay = either(given.weight_decay, defaults.weight_decay).value_or(0.01);
  r.rule.clip_grad_norm = either(given.clip_grad_norm, defaults.clip_grad_norm);
  r.warmup_steps = either(given.warmup_steps, defaults.warmup_steps).value_or(0);
  r.decay = either(given.decay, defaults.decay).value_or(LrDecay::kNone);
  const std::optional<int> decay_steps = either(given.decay_steps, defaults.decay_steps);
  if (r.decay != LrDecay::kNone && !decay_steps) {
    fail(ErrorKind::kInvalidArgument, "{} {} needs {}", name("decay"), to_string(r.decay),
         name("decay-steps"));
  }
  if (r.decay == LrDecay::kNone && decay_steps) {
    fail(ErrorKind::kInvalidArgument, "{} {}: there is no decay (give {} cosine or linear)",
         name("decay-steps"), *decay_steps, name("decay"));
  }
  r.decay_steps = decay_steps.value_or(0);
  return r;
}

double learning_rate(const Optimizer& o, int step) {
  MESHFLOW_CHECK(step >= 1, "learning_rate of step {}", step);
  const double t = step;
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * t / o.warmup_steps;
  if (o.decay == LrDecay::kNone) return o.lr;
  const double u = (t - o.warmup_steps) / o.decay_steps;  // the fraction of the decay done
  if (u >= 1) return 0;
  if (o.decay == LrDecay::kCosine) return o.lr * 0.5 * (1 + std::cos(std::numbers::pi * u));
  return o.lr * (1 - u);
}

TrainDefaults train_defaults_from_json(const nlohmann::json& train, std::string_view source) {
  TrainDefaults defaults;
  OptimizerOptions& o = defaults.optimizer;
  if (train.is_null()) return defaults;
  const JsonField f(train, fmt::format("{}: \"train\"", source), ErrorKind::kInvalidArgument);
  if (!train.is_object()) f.reject("must be an object");
  constexpr double kAny = 1e308;
  for (const auto& [key, value] : train.items()) {
    const JsonField v = f.member(key);
    if (key == "optimizer") {
      o.kind = parse_optimizer_kind(v.as_string());
      if (!o.kind) v.reject("must be \"sgd\" or \"adamw\"");
    } else if (key == "lr") {
      o.lr = v.as_number(-kAny, kAny);
    } else if (key == "momentum") {
      o.momentum = v.as_number(-kAny, kAny);
    } else if (key == "betas") {
      if (v.size() != 2) v.reject("must be [beta1, beta2]");
      o.betas = std::pair{v.at(0).as_number(-kAny, kAny), v.at(1).as_number(-kAny, kAny)};
    } else if (key == "eps") {
      o.eps = v.as_number(-kAny, kAny);
    } else if (key == "weight_decay") {
      o.weight_decay = v.as_number(-kAny, kAny);
    } else if (key == "clip_grad_norm") {
      o.clip_grad_norm = v.as_number(-kAny, kAny);
    } else if (key == "warmup_steps") {
      o.warmup_steps = static_cast<int>(v.as_int(0, 1 << 30));
    } else if (key == "decay") {
      o.decay = parse_lr_decay(v.as_string());
      if (!o.decay) v.reject("must be \"none\", \"cosine\" or \"linear\"");
    } else if (key == "decay_steps") {
      o.decay_steps = static_cast<int>(v.as_int(1, 1 << 30));
    } else if (key == "micro_batches") {
      defaults.micro_batches = static_cast<int>(v.as_int(1, 1 << 20));
    } else if (key == "zero") {
      defaults.zero = static_cast<int>(v.as_int(0, 3));
      if (*defaults.zero == 2) v.reject("must be 0, 1 or 3");
    } else if (key == "schedule") {
      const std::string text = v.as_string();
      if (text != "gpipe" && text != "1f1b" && text != "zb")
        v.reject("must be \"gpipe\", \"1f1b\" or \"zb\"");
      defaults.schedule = parse_schedule(text);
    } else if (key == "recompute") {
      const std::string text = v.as_string();
      if (text != "none" && text != "selective" && text != "full")
        v.reject("must be \"none\", \"selective\" or \"full\"");
      defaults.recompute = parse_recompute(text);
    } else {
      f.reject(fmt::format(
          "has unknown field \"{}\" (allowed: optimizer, lr, momentum, betas, eps, weight_decay, "
          "clip_grad_norm, warmup_steps, decay, decay_steps, micro_batches, zero, schedule, "
          "recompute)",
          key));
    }
  }
  const std::string where = fmt::format("{}: \"train\" field ", source);
  check_ranges(o, [&](std::string_view flag) { return where + "\"" + underscored(flag) + "\""; });
  return defaults;
}

int resolve_zero(std::optional<int> given, const TrainDefaults& defaults, OptionStyle style) {
  if (!given) return defaults.zero.value_or(0);
  if (*given != 0 && *given != 1 && *given != 3) {
    fail(ErrorKind::kInvalidArgument, "{} {}: must be 0, 1 or 3",
         style == OptionStyle::kFlag ? "--zero" : "zero=", *given);
  }
  return *given;
}

Schedule resolve_schedule(const std::optional<std::string>& given, const TrainDefaults& defaults) {
  return given ? parse_schedule(*given) : defaults.schedule.value_or(Schedule::k1f1b);
}

Recompute resolve_recompute(const std::optional<std::string>& given,
                            const TrainDefaults& defaults) {
  return given ? parse_recompute(*given) : defaults.recompute.value_or(Recompute::kNone);
}

nlohmann::json to_json(const Optimizer& o) {
  nlohmann::json j = {{"kind", std::string(to_string(o.rule.kind))}, {"lr", o.lr}};
  if (o.rule.kind == OptimizerKind::kSgd) {
    j["momentum"] = o.rule.momentum;
  } else {
    j["betas"] = {o.rule.beta1, o.rule.beta2};
    j["eps"] = o.rule.eps;
    j["weight_decay"] = o.rule.weight_decay;
  }
  j["clip_grad_norm"] =
      o.rule.clip_grad_norm ? nlohmann::json(*o.rule.clip_grad_norm) : nlohmann::json(nullptr);
  j["warmup_steps"] = o.warmup_steps;
  j["decay"] = std::string(to_string(o.decay));
  j["decay_steps"] = o.decay_steps;
  return j;
}

}  // namespace meshflow
