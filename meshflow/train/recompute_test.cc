// Activation recomputation (DESIGN's "Activation recomputation"): selective and full train bit
// for bit as none (losses, gradients, weights) on every GPT layout and the MLP examples, with
// 1 and 4 micro-batches, ZeRO 0 and 3, every pipeline schedule and --overlap; the runtime holds fewer
// activations as the policy says and the estimate stays within 10% of what it holds; the trace
// shows each recomputed node run once more per micro-batch, and no node more; the model file's
// "train" object gives the schedule and the policy, and the command line wins.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "meshflow/core/compare.h"
#include "meshflow/graph/explain.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = MESHFLOW_EXAMPLES_DIR;

Model example(const std::string& file) { return load_model(kExamples / file); }

struct Config {
  int micro_batches = 1, zero = 0;
  Schedule schedule = Schedule::k1f1b;
  bool overlap = false;  // every collective the patterns allow decomposed around its product
};

std::string text(const Config& c) {
  return fmt::format("M = {}, --zero {}, {}{}", c.micro_batches, c.zero, to_string(c.schedule),
                     c.overlap ? ", --overlap" : "");
}

TrainReport train(const Model& m, const Config& c, Recompute r, int steps = 3) {
  TrainOptions o{.steps = steps,
                 .optimizer = resolve_optimizer({.kind = OptimizerKind::kAdamW, .lr = 0.01}),
                 .micro_batches = c.micro_batches,
                 .schedule = c.schedule,
                 .zero = c.zero,
                 .recompute = r,
                 .check = true};
  o.run.threads_per_device = 1;
  o.run.overlap = o.run.overlap_always = c.overlap;
  return train_model(m, o);
}

// Every policy's losses, gradients and weights are none's, bit for bit.
void expect_equal_to_none(const std::string& file, const Config& c) {
  const Model m = example(file);
  const TrainReport none = train(m, c, Recompute::kNone);
  ASSERT_TRUE(none.check.has_value());
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const std::string what = fmt::format("{}, {}, --recompute {}", file, text(c), to_string(r));
    const TrainReport got = train(m, c, r);
    ASSERT_TRUE(got.check.has_value()) << what;
    ASSERT_EQ(got.steps.size(), none.steps.size()) << what;
    for (std::size_t s = 0; s < none.steps.size(); ++s) {
      EXPECT_EQ(got.steps[s].loss, none.steps[s].loss) << what << " step " << s + 1;
      EXPECT_EQ(got.steps[s].grad_norm, none.steps[s].grad_norm) << what << " step " << s + 1;
      for (const auto& [name, g] : none.check->grads[s]) {
        const auto diff = compare_exact(got.check->grads[s].at(name), g);
        EXPECT_FALSE(diff.has_value())
            << what << " step " << s + 1 << " grad " << name << ": " << diff.value_or("");
      }
      for (const auto& [name, w] : none.check->weights[s]) {
        const auto diff = compare_exact(got.check->weights[s].at(name), w);
        EXPECT_FALSE(diff.has_value())
            << what << " step " << s + 1 << " weight " << name << ": " << diff.value_or("");
      }
    }
  }
}

TEST(Recompute, EveryGptLayoutTrainsBitForBitAsNone) {
  for (const char* layout : {"one", "dp", "tp", "tp_vocab", "sp", "dp_tp"}) {
    for (const Config& c : {Config{1, 0}, Config{4, 3}})
      expect_equal_to_none(fmt::format("gpt/gpt_{}.json", layout), c);
  }
}

TEST(Recompute, GptPipelinesTrainBitForBitAsNoneUnderEverySchedule) {
  for (const char* layout : {"pp", "pp_dp_tp"}) {
    for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb})
      expect_equal_to_none(fmt::format("gpt/gpt_{}.json", layout), {4, 0, s});
    expect_equal_to_none(fmt::format("gpt/gpt_{}.json", layout), {4, 3, Schedule::kZb});
  }
}

TEST(Recompute, TheMlpExamplesTrainBitForBitAsNone) {
  for (const char* file :
       {"dp_mlp.json", "tp_mlp.json", "dp_tp_mlp.json", "tp_sp_mlp.json", "dp_tp_sp_mlp.json"}) {
    for (const Config& c : {Config{1, 0}, Config{4, 3}}) expect_equal_to_none(file, c);
  }
  // Recomputed products decomposed with their collectives, as the forward's are.
  for (const char* file : {"tp_sp_mlp.json", "dp_tp_sp_mlp.json"})
    expect_equal_to_none(file, {2, 0, Schedule::k1f1b, true});
  for (const char* file : {"pipeline_mlp.json", "pipeline4_mlp.json"}) {
    for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb})
      expect_equal_to_none(file, {4, s == Schedule::kZb ? 3 : 0, s});
  }
}

// The estimate of a step's peak: the pipeline's where the step runs on stages.
DeviceMemory estimated(const Model& m, const Config& c, Recompute r, const Optimizer& o) {
  const Explanation e = explain_compiled(
      m.pcg, {.update = o.rule, .micro_batches = c.micro_batches, .zero = c.zero, .recompute = r});
  ModelRunOptions run;
  const std::optional<ScheduleExplanation> s = explain_model_schedule(
      m, run, {.update = o.rule, .micro_batches = c.micro_batches, .zero = c.zero, .recompute = r},
      c.schedule);
  return s && s->memory ? *s->memory : *e.memory;
}

TEST(Recompute, HeldActivationsDropAsThePolicySaysAndTheEstimateFollows) {
  const Optimizer sgd = resolve_optimizer({.lr = 0.1});
  // Whether selective and full hold fewer activations at the step's peak than none: where the
  // peak is the optimizer's (data parallel: a quarter of the activations beside every weight),
  // or where the model marks the only value selective would recompute (the MLPs mark their
  // hidden layer), the peak bytes must still not grow.
  struct Case {
    std::string file;
    Config config;
    bool selective_drops = true, full_drops = true;
    // Whether full also holds fewer activations than selective at its peak (under zb the peak
    // moves to where W's gradients wait, beside either policy's activations).
    bool full_below_selective = true;
  };
  const std::vector<Case> cases = {{"gpt/gpt_one.json", {1, 0}},
                                   {"gpt/gpt_one.json", {4, 0}},
                                   {"gpt/gpt_dp.json", {1, 0}, false, false},
                                   {"gpt/gpt_tp.json", {1, 0}},
                                   {"gpt/gpt_sp.json", {1, 0}},
                                   {"gpt/gpt_dp_tp.json", {4, 3}, true, false},
                                   {"gpt/gpt_pp.json", {4, 0}},
                                   {"gpt/gpt_pp.json", {4, 0, Schedule::kGpipe}},
                                   {"gpt/gpt_pp.json", {4, 0, Schedule::kZb}, true, true, false},
                                   {"gpt/gpt_pp_dp_tp.json", {4, 0}},
                                   {"tp_mlp.json", {1, 0}, false, true},
                                   {"pipeline4_mlp.json", {4, 0}, false, false}};
  for (const Case& k : cases) {
    const Model m = example(k.file);
    std::map<Recompute, DeviceMemory> held;
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      const std::string what =
          fmt::format("{}, {}, --recompute {}", k.file, text(k.config), to_string(r));
      TrainOptions o{.steps = 2,
                     .optimizer = sgd,
                     .micro_batches = k.config.micro_batches,
                     .schedule = k.config.schedule,
                     .zero = k.config.zero,
                     .recompute = r};
      held[r] = train_model(m, o).measured;
      const DeviceMemory est = estimated(m, k.config, r, sgd);
      EXPECT_LE(std::abs(static_cast<double>(est.peak - held[r].peak)),
                0.1 * static_cast<double>(held[r].peak))
          << what << ": estimated " << est.peak << ", measured " << held[r].peak;
    }
    const std::string what = fmt::format("{}, {}", k.file, text(k.config));
    auto activations = [&](Recompute r) { return held[r].at_peak[MemoryKind::kActivations]; };
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      const bool drops = r == Recompute::kSelective ? k.selective_drops : k.full_drops;
      EXPECT_LE(held[r].peak, held[Recompute::kNone].peak) << what << ", " << to_string(r);
      if (drops) {
        EXPECT_LT(activations(r), activations(Recompute::kNone)) << what << ", " << to_string(r);
      } else {
        EXPECT_LE(activations(r), activations(Recompute::kNone)) << what << ", " << to_string(r);
      }
    }
    if (k.selective_drops && k.full_drops && k.full_below_selective) {
      EXPECT_LT(activations(Recompute::kFull), activations(Recompute::kSelective)) << what;
    }
  }
}

// Per device, how often each task ran in step `step`, from the trace.
std::map<int, std::map<std::string, int>> tasks_ran(const fs::path& trace, int step) {
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::map<std::string, int>> out;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X" || e["args"]["step"] != step) continue;
    const std::string cat = e["cat"];
    if (cat == "group" || cat == "transfer" || cat == "product") continue;
    ++out[e["pid"].get<int>()][e["name"].get<std::string>()];
  }
  return out;
}

TEST(Recompute, EachRecomputedNodeRunsOnceMorePerMicroBatchInBackward) {
  const fs::path trace =
      fs::temp_directory_path() / fmt::format("meshflow_recompute_{}.json", ::getpid());
  const Model m = example("gpt/gpt_dp_tp.json");
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    constexpr int kMicro = 2;
    TrainOptions o{.steps = 2, .micro_batches = kMicro, .recompute = r};
    o.run.trace = trace;
    train_model(m, o);
    const std::map<int, std::map<std::string, int>> ran = tasks_ran(trace, 2);
    ASSERT_EQ(ran.size(), 4u);
    const Explanation e = explain_compiled(m.pcg, {.micro_batches = kMicro, .recompute = r});
    std::set<std::string> recomputed;
    for (const RecomputedSegment& s : e.recompute)
      recomputed.insert(s.nodes.begin(), s.nodes.end());
    ASSERT_FALSE(recomputed.empty());
    for (const auto& [device, counts] : ran) {
      for (const auto& [name, n] : counts) {
        const std::string what =
            fmt::format("--recompute {}, device {}, {}", to_string(r), device, name);
        if (name.starts_with("recompute:")) {
          EXPECT_TRUE(recomputed.contains(name.substr(10))) << what;
          EXPECT_EQ(n, kMicro) << what;
          auto original = counts.find(name.substr(10));
          // Its forward run (a kernel fused into another's task is named by that one).
          if (original != counts.end()) {
            EXPECT_EQ(original->second, kMicro) << what;
          }
        } else {
          EXPECT_LE(n, kMicro) << what;
        }
      }
    }
    // Every recomputed node ran again (fused ones inside their partner's task).
    int runs = 0;
    for (const auto& [name, n] : ran.at(0)) runs += name.starts_with("recompute:") ? 1 : 0;
    EXPECT_GT(runs, 0);
  }
  fs::remove(trace);
}

TEST(Recompute, FullOnAModelThatMarksNothingNamesTheOption) {
  Model m = example("dp_mlp.json");
  for (Node& n : m.pcg.nodes) n.checkpoint = false;
  try {
    train_model(m, {.recompute = Recompute::kFull});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Recompute, TheTrainObjectGivesScheduleAndRecompute) {
  const TrainDefaults d = train_defaults_from_json(
      {{"schedule", "gpipe"}, {"recompute", "selective"}, {"micro_batches", 4}}, "m.json");
  EXPECT_EQ(d.schedule, Schedule::kGpipe);
  EXPECT_EQ(d.recompute, Recompute::kSelective);
  EXPECT_EQ(d.micro_batches, 4);
  for (const auto& [bad, field] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"schedule", "zz"}}, "schedule"}, {{{"recompute", "all"}}, "recompute"}}) {
    try {
      train_defaults_from_json(bad, "m.json");
      FAIL() << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshflow
