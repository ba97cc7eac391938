// Optimizer options: defaults, precedence over the model file's "train" object, every invalid
// option of DESIGN's list named in one line, and the learning-rate schedule's values.
#include "meshflow/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

std::string error_of(const OptimizerOptions& given, const OptimizerOptions& defaults = {},
                     OptionStyle style = OptionStyle::kFlag) {
  try {
    resolve_optimizer(given, defaults, style);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(ResolveOptimizer, DefaultsAreTorchOptims) {
  const Optimizer sgd = resolve_optimizer({});
  EXPECT_EQ(sgd.rule.kind, OptimizerKind::kSgd);
  EXPECT_EQ(sgd.lr, 0.1);
  EXPECT_EQ(sgd.rule.momentum, 0);
  EXPECT_FALSE(sgd.rule.clip_grad_norm.has_value());
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  EXPECT_EQ(adamw.lr, 0.001);
  EXPECT_EQ(adamw.rule.beta1, 0.9);
  EXPECT_EQ(adamw.rule.beta2, 0.999);
  EXPECT_EQ(adamw.rule.eps, 1e-8);
  EXPECT_EQ(adamw.rule.weight_decay, 0.01);
  EXPECT_EQ(adamw.decay, LrDecay::kNone);
}

TEST(ResolveOptimizer, GivenOptionsWinOverTheModelFile) {
  const OptimizerOptions file =
      train_defaults_from_json(
          nlohmann::json::parse(R"({"optimizer": "adamw", "lr": 0.01, "betas": [0.8, 0.9],
                                "clip_grad_norm": 1.5, "warmup_steps": 3})"),
          "m.json")
          .optimizer;
  const Optimizer o = resolve_optimizer({.lr = 0.02}, file);
  EXPECT_EQ(o.rule.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(o.lr, 0.02);
  EXPECT_EQ(o.rule.beta1, 0.8);
  EXPECT_EQ(o.rule.clip_grad_norm, 1.5);
  EXPECT_EQ(o.warmup_steps, 3);
}

TEST(ResolveOptimizer, EveryInvalidOptionIsOneLineNamingIt) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const OptimizerKind adamw = OptimizerKind::kAdamW;
  const std::vector<std::pair<OptimizerOptions, std::string>> cases = {
      {{.lr = nan}, "--lr nan: must be finite and >= 0"},
      {{.lr = -0.1}, "--lr -0.1: must be finite and >= 0"},
      {{.lr = inf}, "--lr inf: must be finite and >= 0"},
      {{.momentum = 1}, "--momentum 1: must be in [0, 1)"},
      {{.momentum = -0.5}, "--momentum -0.5: must be in [0, 1)"},
      {{.kind = adamw, .betas = std::pair{0.9, 1.0}}, "--betas 0.9,1: each beta must be in [0, 1)"},
      {{.kind = adamw, .betas = std::pair{nan, 0.9}},
       "--betas nan,0.9: each beta must be in [0, 1)"},
      {{.kind = adamw, .eps = 0}, "--eps 0: must be finite and > 0"},
      {{.kind = adamw, .weight_decay = -1}, "--weight-decay -1: must be finite and >= 0"},
      {{.clip_grad_norm = 0}, "--clip-grad-norm 0: must be finite and > 0"},
      {{.clip_grad_norm = nan}, "--clip-grad-norm nan: must be finite and > 0"},
      {{.warmup_steps = -1}, "--warmup-steps -1: must be >= 0"},
      {{.decay_steps = 0, .decay = LrDecay::kCosine}, "--decay-steps 0: must be >= 1"},
      {{.decay = LrDecay::kLinear}, "--decay linear needs --decay-steps"},
      {{.decay_steps = 5}, "--decay-steps 5: there is no decay (give --decay cosine or linear)"},
      {{.kind = adamw, .momentum = 0.9}, "--momentum is not an option of --optimizer adamw"},
      {{.betas = std::pair{0.9, 0.99}}, "--betas is not an option of --optimizer sgd"},
      {{.eps = 1e-6}, "--eps is not an option of --optimizer sgd"},
      {{.weight_decay = 0.1}, "--weight-decay is not an option of --optimizer sgd"},
  };
  for (const auto& [given, want] : cases) {
    const std::string got = error_of(given);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
  EXPECT_EQ(error_of({.weight_decay = -1}, {}, OptionStyle::kKeyword),
            "weight_decay= -1: must be finite and >= 0");
  // An option of the other optimizer in the model file, the optimizer given on the command line.
  EXPECT_EQ(error_of({.kind = OptimizerKind::kSgd}, {.kind = adamw, .eps = 1e-6}),
            "--eps is not an option of --optimizer sgd (it comes from the model file's \"train\")");
}

TEST(TrainDefaultsFromJson, NamesTheFileAndTheField) {
  auto error = [](const char* text) {
    try {
      train_defaults_from_json(nlohmann::json::parse(text), "m.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(R"({"lr": -1})").find("m.json: \"train\" field \"lr\""), std::string::npos)
      << error(R"({"lr": -1})");
  EXPECT_NE(error(R"({"steps": 3})").find("unknown field \"steps\""), std::string::npos);
  EXPECT_NE(error(R"({"schedule": "interleaved"})").find("\"schedule\""), std::string::npos);
  EXPECT_EQ(error(R"({"schedule": "zb", "recompute": "full"})"), "");
  EXPECT_NE(error(R"({"zero": 2})").find("m.json: \"train\": \"zero\" must be 0, 1 or 3"),
            std::string::npos)
      << error(R"({"zero": 2})");
  EXPECT_NE(error(R"({"zero": 4})").find("\"zero\""), std::string::npos);
  EXPECT_EQ(train_defaults_from_json(nlohmann::json::parse(R"({"zero": 3})"), "m.json").zero, 3);
  EXPECT_NE(error(R"({"optimizer": "adam"})").find("must be \"sgd\" or \"adamw\""),
            std::string::npos);
  EXPECT_NE(error(R"({"betas": [0.9]})").find("must be [beta1, beta2]"), std::string::npos);
  EXPECT_NE(error(R"({"warmup_steps": 1.5})").find("warmup_steps"), std::string::npos);
  EXPECT_EQ(train_defaults_from_json(nullptr, "m.json"), TrainDefaults{});
  EXPECT_EQ(train_defaults_from_json(nlohmann::json::parse(R"({"micro_batches": 4})"), "m.json")
                .micro_batches,
            4);
  EXPECT_NE(error(R"({"micro_batches": 0})").find("micro_batches"), std::string::npos);
}

TEST(LearningRate, WarmupThenCosineOrLinearDecayToZero) {
  Optimizer o{.lr = 0.8, .warmup_steps = 4, .decay = LrDecay::kCosine, .decay_steps = 6};
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3), 0.6);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 0.8);
  EXPECT_DOUBLE_EQ(learning_rate(o, 5), 0.8 * 0.5 * (1 + std::cos(std::numbers::pi / 6)));
  EXPECT_DOUBLE_EQ(learning_rate(o, 7), 0.4);  // half way: cos(pi/2) = 0
  EXPECT_EQ(learning_rate(o, 10), 0.0);
  EXPECT_EQ(learning_rate(o, 11), 0.0);
  o.decay = LrDecay::kLinear;
  EXPECT_DOUBLE_EQ(learning_rate(o, 5), 0.8 * 5 / 6);
  EXPECT_DOUBLE_EQ(learning_rate(o, 8), 0.8 * 2 / 6);
  EXPECT_EQ(learning_rate(o, 12), 0.0);
  const Optimizer constant{.lr = 0.3};
  EXPECT_EQ(learning_rate(constant, 1), 0.3);
  EXPECT_EQ(learning_rate(constant, 1000), 0.3);
}

TEST(OptimizerJson, IsTheCheckpointsOptimizerObject) {
  const Optimizer o = resolve_optimizer({.kind = OptimizerKind::kAdamW, .clip_grad_norm = 1.0});
  const nlohmann::json j = to_json(o);
  EXPECT_EQ(j["kind"], "adamw");
  EXPECT_EQ(j["betas"], nlohmann::json({0.9, 0.999}));
  EXPECT_EQ(j["clip_grad_norm"], 1.0);
  EXPECT_EQ(j["decay"], "none");
  EXPECT_FALSE(j.contains("momentum"));
}

}  // namespace
}  // namespace meshflow
