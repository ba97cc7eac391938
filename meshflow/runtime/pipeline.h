// Pipeline stages running at once. Where a training step's per-micro-batch work lies on
// disjoint meshes (stages, numbered in the order the forward pass first uses them), each
// device runs its stage's task groups in the order a schedule gives (train/schedule.h):
// F<i> (micro-batch i's forward tasks), B<i> (its backward tasks; under a split schedule only
// those the gradient sent upstream needs) and W<i> (the rest: weight gradients). Each
// micro-batch keeps its own values (its activation set) from F<i> until its last backward group
// has run. Moves between stages are point-to-point transfers matched by tag: the sender posts
// them and goes on, the receiver waits for them, so stage s computes micro-batch i while stage
// s + 1 computes i - 1.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/graph/memory.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/runtime/task_runtime.h"

namespace meshflow {

enum class GroupKind { kForward, kBackward, kWeight };

// One task group of a stage's schedule: "F3", "B3", "W3".
struct ScheduledGroup {
  GroupKind kind = GroupKind::kForward;
  int micro_batch = 0;
  bool operator==(const ScheduledGroup&) const = default;
};

// Returns "F3", "B3" or "W3".
std::string to_string(const ScheduledGroup& g);

// The stages of a task graph: their meshes, in the order the forward pass first uses them.
struct PipelineStages {
  std::vector<DeviceMesh> meshes;
  std::map<DeviceId, int> stage_of;
};

// Returns the stages of `graph` when its per-micro-batch tasks lie on two or more disjoint
// meshes and every such task stays on one stage or moves a value from one stage's mesh to
// another's; nullopt otherwise (nothing to pipeline).
std::optional<PipelineStages> find_stages(const TaskGraph& graph);

// One device's part of a pipelined step, derived from its DeviceTasks: the tasks of each group
// kind (indices, in task order), the moves between stages (task index -> whether it sends, and
// its tag base), and the tasks with their releases moved to the last reader in group order.
struct DevicePipeline {
  int stage = 0;
  DeviceTasks tasks;
  std::vector<int> forward, backward, weight;
  // Receives of values no per-micro-batch task here reads (a fetch to the leader): run for
  // every micro-batch after the stage's groups.
  std::vector<int> deferred;
  std::map<int, TaggedMove> cross;    // the tag of micro-batch m is tag + m
  std::vector<ScheduledGroup> order;  // the schedule this device runs
};

// Returns the tasks (indices, in task order) of `pipeline`'s groups of `kind`.
const std::vector<int>& group_tasks(const DevicePipeline& pipeline, GroupKind kind);

// Returns every device's pipeline (graph order; stage -1 for a device on no stage) under
// `stages`, stage s running orders[s]; with `split_weights` (zb) the backward tasks that no
// transfer upstream needs form W groups (B keeps those and the gradient's receipt from
// downstream, so a stage's B<i> ends after the next stage's). `micro_batches` sizes the tags.
std::vector<DevicePipeline> device_pipelines(const TaskGraph& graph, const PipelineStages& stages,
                                             const std::vector<std::vector<ScheduledGroup>>& orders,
                                             bool split_weights, int micro_batches);

// Returns why `pipelines` (every device's, in graph order; stage -1 for a device on no stage)
// could wait on each other in a cycle under a schedule, naming the value, or nullopt when they
// cannot: a value must go to a later stage from the sender's forward group, and to an earlier
// stage into the receiver's backward or weight group (or, unread, after the groups) from the
// sender's forward or B group.
std::optional<std::string> pipeline_conflict(const TaskGraph& graph, const PipelineStages& stages,
                                             const std::vector<DevicePipeline>& pipelines);

// Returns the bytes of one micro-batch's activation set on the device: the values its forward
// group makes there and its backward groups read.
std::int64_t activation_set_bytes(const TaskGraph& graph, const DevicePipeline& pipeline);

// Returns each device's peak over one pipelined step of task graph `g` (of compiled graph
// `pcg`) run as `pipelines` (device_pipelines', in g's device order), as run_pipeline_step
// holds them: sources throughout, each micro-batch's inputs in its set until its last group,
// the values a group makes in the micro-batch's set until their release (moved to the last
// reader in group order) or the set's last group, the accumulated values' sums beside, then
// the once-per-step tasks as graph/memory.h's estimate_memory walks them.
std::vector<DeviceMemory> estimate_pipeline_memory(const Pcg& pcg, const TaskGraph& g,
                                                   const std::vector<DevicePipeline>& pipelines,
                                                   int micro_batches);

// What a pipelined step measured on one device: the window from its first forward group's
// start to its last backward group's end, the time its groups spent in tasks other than
// waiting for transfers (compute), and the most activation sets it held at once and the peak
// bytes of the activations they kept (forward values and their recomputations; the
// micro-batches' inputs, and the gradients a set waiting for its W holds, not counted: these
// are in the step's measured memory as gradients). The groups it ran, in
// order, are in its trace (TraceKind::kGroup).
struct PipelineStepStats {
  double window_s = 0, busy_s = 0;
  int peak_sets = 0;
  std::int64_t peak_set_bytes = 0;
};

// Runs one training step of `micro_batches` micro-batches in `pipeline`'s order (run_step's
// contract otherwise: the accumulated values summed in micro-batch order and divided by M,
// then the once-per-step tasks).
void run_pipeline_step(const TaskGraph& graph, const DevicePipeline& pipeline, Communicator& world,
                       std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
                       int micro_batches, TaskRunOptions options, PipelineStepStats* stats);

}  // namespace meshflow
