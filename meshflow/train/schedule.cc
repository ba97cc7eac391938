// The schedules, and their bubble with unit-time groups.
#include "meshflow/train/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "meshflow/core/error.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/step_time.h"
#include "meshflow/plan/plan_cache.h"

namespace meshflow {

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1f1b:
      return "1f1b";
    case Schedule::kZb:
      return "zb";
  }
  return "?";
}

Schedule parse_schedule(std::string_view text) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1f1b, Schedule::kZb})
    if (text == to_string(s)) return s;
  fail(ErrorKind::kInvalidArgument, "unknown schedule \"{}\" (expected gpipe, 1f1b or zb)", text);
}

int activation_set_limit(Schedule s, int stages, int stage, int micro_batches) {
  return s == Schedule::kGpipe ? micro_batches : std::min(stages - stage, micro_batches);
}

int held_set_limit(Schedule s, int stages, int stage, int micro_batches) {
  const int limit = activation_set_limit(s, stages, stage, micro_batches);
  return s == Schedule::kZb ? std::min(limit + 1, micro_batches) : limit;
}

double theory_bubble(Schedule s, int stages, int micro_batches) {
  const double p = stages, m = micro_batches;
  return s == Schedule::kZb ? (p - 1) / (3 * m + p - 1) : (p - 1) / (m + p - 1);
}

namespace {

ScheduledGroup F(int i) { return {GroupKind::kForward, i}; }
ScheduledGroup B(int i) { return {GroupKind::kBackward, i}; }
ScheduledGroup W(int i) { return {GroupKind::kWeight, i}; }

// ZB-H1 by list scheduling over unit-time groups (see the header).
std::vector<std::vector<ScheduledGroup>> zero_bubble(int p, int M) {
  std::vector<std::vector<ScheduledGroup>> orders(static_cast<std::size_t>(p));
  // done[kind][s][i]: the time group kind of micro-batch i finished on stage s (-1: not yet).
  std::vector<std::vector<std::vector<int>>> done(
      3, std::vector<std::vector<int>>(static_cast<std::size_t>(p),
                                       std::vector<int>(static_cast<std::size_t>(M), -1)));
  auto finished = [&](int kind, int s, int i, int t) {
    const int at = done[static_cast<std::size_t>(kind)][static_cast<std::size_t>(s)]
                       [static_cast<std::size_t>(i)];
    return at >= 0 && at <= t;
  };
  std::vector<int> next_f(static_cast<std::size_t>(p), 0), next_b(static_cast<std::size_t>(p), 0),
      next_w(static_cast<std::size_t>(p), 0);
  const auto total = static_cast<std::size_t>(3 * M);
  for (int t = 0;; ++t) {
    bool all = true;
    for (int s = 0; s < p; ++s) {
      const auto su = static_cast<std::size_t>(s);
      if (orders[su].size() == total) continue;
      all = false;
      const int b = next_b[su], f = next_f[su], w = next_w[su];
      ScheduledGroup pick{};
      bool picked = false;
      if (b < M && b < f && finished(0, s, b, t) && (s == p - 1 || finished(1, s + 1, b, t))) {
        pick = B(b);
        picked = true;
      } else if (f < M && f - b < std::min(p - s, M) && f - w <= std::min(p - s, M) &&
                 (s == 0 || finished(0, s - 1, f, t))) {
        pick = F(f);
        picked = true;
      } else if (w < b) {
        pick = W(w);
        picked = true;
      }
      if (!picked) continue;
      const int kind = static_cast<int>(pick.kind);
      done[static_cast<std::size_t>(kind)][su][static_cast<std::size_t>(pick.micro_batch)] = t + 1;
      (kind == 0 ? next_f : kind == 1 ? next_b : next_w)[su]++;
      orders[su].push_back(pick);
    }
    if (all) break;
    MESHFLOW_CHECK(t < 16 * (M + p) + 64, "zero-bubble schedule did not converge");
  }
  return orders;
}

}  // namespace

std::vector<std::vector<ScheduledGroup>> pipeline_orders(Schedule s, int p, int M) {
  MESHFLOW_CHECK(p >= 1 && M >= 1);
  if (s == Schedule::kZb) return zero_bubble(p, M);
  std::vector<std::vector<ScheduledGroup>> orders(static_cast<std::size_t>(p));
  for (int stage = 0; stage < p; ++stage) {
    auto& o = orders[static_cast<std::size_t>(stage)];
    if (s == Schedule::kGpipe) {
      for (int i = 0; i < M; ++i) o.push_back(F(i));
      for (int i = 0; i < M; ++i) o.push_back(B(i));
      continue;
    }
    const int w = std::min(p - 1 - stage, M);
    for (int i = 0; i < w; ++i) o.push_back(F(i));
    for (int k = w; k < M; ++k) {
      o.push_back(F(k));
      o.push_back(B(k - w));
    }
    for (int i = M - w; i < M; ++i) o.push_back(B(i));
  }
  return orders;
}

double simulated_bubble(const std::vector<std::vector<ScheduledGroup>>& orders,
                        const std::vector<GroupSeconds>& seconds) {
  const auto p = static_cast<int>(orders.size());
  MESHFLOW_CHECK(seconds.size() == orders.size());
  auto length = [&](int stage, const ScheduledGroup& g) {
    const GroupSeconds& t = seconds[static_cast<std::size_t>(stage)];
    return g.kind == GroupKind::kForward    ? t.forward
           : g.kind == GroupKind::kBackward ? t.backward
                                            : t.weight;
  };
  std::map<std::tuple<int, int, int>, double> finish;  // (stage, kind, micro-batch)
  std::vector<std::size_t> next(orders.size(), 0);
  std::vector<double> free_at(orders.size(), 0), busy(orders.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      const auto su = static_cast<std::size_t>(st);
      while (next[su] < orders[su].size()) {
        const ScheduledGroup& g = orders[su][next[su]];
        double ready = free_at[su];
        auto need = [&](int stage, GroupKind k) {
          auto it = finish.find({stage, static_cast<int>(k), g.micro_batch});
          if (it == finish.end()) return false;
          ready = std::max(ready, it->second);
          return true;
        };
        bool ok = true;
        if (g.kind == GroupKind::kForward && st > 0) ok = need(st - 1, GroupKind::kForward);
        if (g.kind == GroupKind::kBackward && st < p - 1) ok = need(st + 1, GroupKind::kBackward);
        if (!ok) break;
        free_at[su] = ready + length(st, g);
        busy[su] += length(st, g);
        finish[{st, static_cast<int>(g.kind), g.micro_batch}] = free_at[su];
        ++next[su];
        progress = true;
      }
    }
  }
  double sum = 0;
  for (std::size_t su = 0; su < orders.size(); ++su) {
    MESHFLOW_CHECK(next[su] == orders[su].size(), "schedule deadlocks on stage {}", su);
    // Every stage's window opens at the step's start, where the runtime starts its first group
    // (a later stage's wait for its first activation is idle, as the runtime counts it).
    const double window = free_at[su];
    sum += window > 0 ? (window - busy[su]) / window : 0;
  }
  return orders.empty() ? 0 : sum / static_cast<double>(orders.size());
}

double simulated_bubble(Schedule s, const std::vector<std::vector<ScheduledGroup>>& orders) {
  const GroupSeconds unit{.forward = 1, .backward = s == Schedule::kZb ? 1.0 : 2.0, .weight = 1};
  return simulated_bubble(orders, std::vector<GroupSeconds>(orders.size(), unit));
}

std::optional<ScheduleExplanation> explain_schedule(const PreparedModel& prepared, Schedule s,
                                                    const MachineModel& machine) {
  if (prepared.not_pipelined) return ScheduleExplanation{.not_pipelined = prepared.not_pipelined};
  if (!prepared.stages) return std::nullopt;
  ScheduleExplanation e{.schedule = s, .micro_batches = prepared.micro_batches};
  PlanCache plans(PlanOptions{.machine = &machine});
  const TaskGraph& g = prepared.tasks;
  std::vector<GroupSeconds> seconds;
  for (std::size_t st = 0; st < prepared.stages->meshes.size(); ++st) {
    // The stage's first device stands for it (its devices run the same groups).
    std::size_t i = 0;
    while (prepared.pipelines[i].stage != static_cast<int>(st)) ++i;
    const DevicePipeline& dp = prepared.pipelines[i];
    const DeviceId device = dp.tasks.device;
    auto group_seconds = [&](const std::vector<int>& group) {
      double t = 0;
      for (int k : group)
        t += task_time(prepared.pcg, g, dp.tasks.tasks[static_cast<std::size_t>(k)], device,
                       machine, plans)
                 .total();
      return t;
    };
    StageExplanation stage{.stage = static_cast<int>(st),
                           .mesh = prepared.stages->meshes[st],
                           .tasks = dp.order,
                           .seconds = {.forward = group_seconds(dp.forward),
                                       .backward = group_seconds(dp.backward),
                                       .weight = group_seconds(dp.weight)}};
    int held = 0;
    for (const ScheduledGroup& grp : dp.order) {
      held += grp.kind == GroupKind::kForward ? 1 : 0;
      stage.activation_sets = std::max(stage.activation_sets, held);
      const bool last = grp.kind == (dp.weight.empty() ? GroupKind::kBackward : GroupKind::kWeight);
      held -= last ? 1 : 0;
    }
    stage.activation_bytes = stage.activation_sets * activation_set_bytes(g, dp);
    seconds.push_back(stage.seconds);
    e.stages.push_back(std::move(stage));
  }
  std::vector<std::vector<ScheduledGroup>> orders;
  for (const StageExplanation& st : e.stages) orders.push_back(st.tasks);
  e.est_bubble = simulated_bubble(orders, seconds);
  for (const DeviceMemory& d :
       estimate_pipeline_memory(prepared.pcg, g, prepared.pipelines, prepared.micro_batches)) {
    if (!e.memory || d.peak > e.memory->peak) e.memory = d;
  }
  return e;
}

std::optional<ScheduleExplanation> explain_model_schedule(const Model& model,
                                                          const ModelRunOptions& run,
                                                          TrainingCompile training, Schedule s) {
  if (!model.pcg.loss) return std::nullopt;
  training.schedule = [s](int stages, int micro_batches) {
    return pipeline_orders(s, stages, micro_batches);
  };
  training.split_weights = s == Schedule::kZb;
  const PreparedModel prepared = prepare_model(model, Mode::kTrain, run, training);
  return explain_schedule(prepared, s, run.plan.machine ? *run.plan.machine : default_machine());
}

nlohmann::json to_json(const std::optional<ScheduleExplanation>& e) {
  if (!e || e->not_pipelined) return {{"schedule", nullptr}, {"est_bubble", nullptr}};
  nlohmann::json stages = nlohmann::json::array();
  for (const StageExplanation& s : e->stages) {
    std::vector<std::string> tasks;
    for (const ScheduledGroup& g : s.tasks) tasks.push_back(to_string(g));
    stages.push_back({{"stage", s.stage},
                      {"mesh", explicit_text(s.mesh)},
                      {"tasks", tasks},
                      {"activation_sets", s.activation_sets},
                      {"est_activation_bytes", s.activation_bytes}});
  }
  return {{"schedule", stages}, {"est_bubble", e->est_bubble}};
}

std::string to_text(const std::optional<ScheduleExplanation>& e) {
  if (!e) return "";
  if (e->not_pipelined) {
    return fmt::format("pipeline: none, the stages run one after another: {}\n", *e->not_pipelined);
  }
  std::string out =
      fmt::format("pipeline: {} stages, schedule {}, {} micro-batches, est bubble {:.3f}\n",
                  e->stages.size(), to_string(e->schedule), e->micro_batches, e->est_bubble);
  for (const StageExplanation& s : e->stages) {
    out +=
        fmt::format("  stage {} on {}: {}  ({} activation sets, est {} bytes)\n", s.stage,
                    explicit_text(s.mesh), to_text(s.tasks), s.activation_sets, s.activation_bytes);
  }
  return out;
}

std::string to_text(const std::vector<ScheduledGroup>& order) {
  std::string out;
  for (const ScheduledGroup& g : order) out += (out.empty() ? "" : " ") + to_string(g);
  return out;
}

}  // namespace meshflow
