// Pipeline schedules (DESIGN's "Pipeline schedules"): the order of task groups each stage runs
// (runtime/pipeline.h runs them). gpipe: every forward, then every backward, each in
// micro-batch order. 1f1b (PipeDream-flush): stage s of p runs w = min(p - 1 - s, M) forwards,
// then one forward and one backward in turn until the forwards are done, then the remaining
// backwards. zb (ZB-H1): each backward split into B (the input gradient, sent upstream at once)
// and W (the weight gradients), W deferred into the slots where 1F1B waits, as a list scheduler
// over unit-time tasks finds them: a free stage runs the oldest B whose gradient has arrived,
// else the next forward whose activation has arrived while fewer than p - s sets wait for their
// B (ZB-H1's accounting) and at most p - s for their W (so a stage holds at most one set more
// than 1F1B's, counting the values a W still reads as a whole set), else the oldest pending W.
// It reaches ZB-H1's bubble bound on 2 stages; on 4 the one extra set keeps it within 0.04 of
// it. Every schedule runs each task once, F<i> before B<i> before W<i>.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/runtime/model_runner.h"
#include "meshflow/runtime/pipeline.h"

namespace meshflow {

enum class Schedule { kGpipe, k1f1b, kZb };

// Returns "gpipe", "1f1b", "zb".
std::string_view to_string(Schedule s);

// Returns the schedule named `text`; throws Error naming it otherwise.
Schedule parse_schedule(std::string_view text);

// Returns each stage's groups (index: stage) for p stages and M micro-batches.
std::vector<std::vector<ScheduledGroup>> pipeline_orders(Schedule s, int stages, int micro_batches);

// Returns the most activation sets stage s may hold: M under gpipe, p - s under 1f1b and zb
// (never more than M), a set counting from F<i> until B<i> under zb.
int activation_set_limit(Schedule s, int stages, int stage, int micro_batches);

// Returns the most sets stage s holds at once counting each until its last group (W<i> under
// zb): activation_set_limit, and under zb one more (never more than M).
int held_set_limit(Schedule s, int stages, int stage, int micro_batches);

// Returns the idle fraction of a step with forward, B and W of equal time: (p - 1) / (M + p - 1),
// and under zb (p - 1) / (3M + p - 1).
double theory_bubble(Schedule s, int stages, int micro_batches);

// The seconds of one micro-batch's F, B and W groups on a stage.
struct GroupSeconds {
  double forward = 1, backward = 1, weight = 1;
};

// Returns the bubble of `orders` run with each stage's group times (`seconds`, one per stage)
// and transfers that take no time: the mean over stages of the idle part of each stage's window
// (the step's start, where its first group starts waiting for its input, to its last group's
// end), as the runtime measures it.
double simulated_bubble(const std::vector<std::vector<ScheduledGroup>>& orders,
                        const std::vector<GroupSeconds>& seconds);

// The same with unit-time groups (a B under gpipe and 1f1b, which holds W, taking two units).
double simulated_bubble(Schedule s, const std::vector<std::vector<ScheduledGroup>>& orders);

// What `explain` shows of a pipelined step: per stage its mesh, its groups, the most
// activation sets it holds and their estimated bytes (one micro-batch's values that its
// forward group makes and its backward groups read, on its first device, times the sets); and
// the step's bubble estimated by simulating the schedule with the cost model's group times.
struct StageExplanation {
  int stage = 0;
  DeviceMesh mesh;
  std::vector<ScheduledGroup> tasks;
  int activation_sets = 0;
  std::int64_t activation_bytes = 0;
  GroupSeconds seconds;
};
struct ScheduleExplanation {
  // Set when the model lies on stages that cannot run at once: why (they then run one after
  // another, and the rest is empty).
  std::optional<std::string> not_pipelined;
  Schedule schedule = Schedule::k1f1b;
  int micro_batches = 1;
  std::vector<StageExplanation> stages;
  double est_bubble = 0;
  // The device whose tensors peak highest in the pipelined step (estimate_pipeline_memory).
  std::optional<DeviceMemory> memory;
};

// Returns the explanation of `prepared`'s pipeline (nullopt when it runs on one stage), its
// groups priced with `machine` (graph/step_time.h's task_time).
std::optional<ScheduleExplanation> explain_schedule(const PreparedModel& prepared, Schedule s,
                                                    const MachineModel& machine);

// Returns the explanation of training `model` with `training`'s options under schedule `s`:
// compiled and expanded as `train` would run it (nullopt without a loss or stages).
std::optional<ScheduleExplanation> explain_model_schedule(const Model& model,
                                                          const ModelRunOptions& run,
                                                          TrainingCompile training, Schedule s);

// {"schedule": [{"stage", "mesh", "tasks", "activation_sets", "est_activation_bytes"}],
// "est_bubble"}, both null without stages.
nlohmann::json to_json(const std::optional<ScheduleExplanation>& e);

// The lines `explain` prints (empty without stages).
std::string to_text(const std::optional<ScheduleExplanation>& e);

// Returns a stage's groups as one line: "F0 F1 B0 F2 B1 B2".
std::string to_text(const std::vector<ScheduledGroup>& order);

}  // namespace meshflow
