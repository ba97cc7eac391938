// Runs one device's part of a task graph (graph/task_graph.h) over a Communicator: kernels on
// its shards, its part of every move through the plan executor, its term of the gradient norm,
// and the optimizer's updates in place. Each
// task starts once the events of the tasks it depends on are complete, and completes its own;
// tasks run in the graph's order, which every device of a move shares, so collectives match
// and results are identical run to run.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/graph/memory.h"
#include "meshflow/graph/task_graph.h"

namespace meshflow {

// What a trace event is: a task (a kernel, a move, an update, an overlapped loop), inside an
// overlapped loop one block's transfer or product, or
// a pipeline stage's task group (runtime/pipeline.h: F3, B3, W3, spanning its tasks).
enum class TraceKind { kCompute, kMove, kUpdate, kOverlap, kTransfer, kProduct, kGroup };

// Returns "compute", "move", "update", "overlap", "transfer", "product", "group".
std::string_view to_string(TraceKind kind);

// One task (or block of an overlapped loop) as it ran, for traces (steady-clock seconds).
struct TraceEvent {
  DeviceId device = 0;
  ValueId value = 0;
  TraceKind kind = TraceKind::kCompute;
  Phase phase = Phase::kForward;
  int step = 0;
  int block = -1;  // kTransfer, kProduct
  double start_s = 0, end_s = 0;
  // kGroup: 'F', 'B' or 'W' and the micro-batch (named "F3" in traces).
  char group = 0;
  int micro_batch = -1;
  // A task's CPU seconds on its device's thread (the helpers of a team of several threads
  // not counted), -1 where not measured (blocks, groups): below end_s - start_s where the
  // task waited for a core or for its peers.
  double cpu_s = -1;
};

// Where a device's run accounts its time (for the train benchmark): kernels and updates (and
// the products of overlapped loops), moves (and the rest of those loops), and the whole run;
// update_s is the part of compute_s the optimizer took (the gradient norm's terms and the
// updates).
struct TaskTimes {
  double compute_s = 0, move_s = 0, total_s = 0, update_s = 0;
  // A pipelined step's bubble (runtime/pipeline.h): over every device of the stages, the idle
  // part of its window from its first forward group's start to its last backward group's end,
  // the mean over those devices (set by the model runner for the reporting device).
  std::optional<double> bubble;
  // The longest any device of the step waited for its data inputs (set by the model runner
  // where the loop feeds data).
  std::optional<double> data_wait_s;
  // The step's global gradient norm before clipping (set by the model runner where the step
  // computes one; infinite where it is not finite).
  std::optional<double> grad_norm;
};

// A move between pipeline stages (runtime/pipeline.h), run as point-to-point transfers matched
// by `tag`: the sender posts them and goes on (its buffers wait in TaskRunOptions::sending),
// the receiver waits for them.
struct TaggedMove {
  bool sends = false;
  int tag = 0;
};

// A posted send's packed data, kept until its event completes.
struct PendingSend {
  Tensor data;
  Event done;
};

struct TaskRunOptions {
  TaskPart part = TaskPart::kAll;
  // When set: run exactly these tasks (indices, in this order) instead of `part`'s; their
  // dependencies outside the list ran in earlier calls.
  const std::vector<int>* only = nullptr;
  // Moves between pipeline stages by task index, and where their posted sends wait.
  const std::map<int, TaggedMove>* tagged = nullptr;
  std::vector<PendingSend>* sending = nullptr;
  int micro_batch = 0;  // the micro-batch running (a tagged move's tag is its tag + this)
  double lr = 0.1;      // updates: this step's learning rate
  int step = 1;         // updates: the step number, 1-based (adamw's bias corrections); traces
  // Updates run when the squared gradient norm they read is not finite (a NaN or infinite
  // loss or gradient); by default they are skipped.
  bool allow_nonfinite = false;
  std::vector<TraceEvent>* trace = nullptr;  // appended to when set
  // Observes the bytes of every value after each task (and `beside`: what the step holds
  // beside the values) when set.
  MemoryCounter* memory = nullptr;
  MemoryBreakdown beside;
  TaskTimes* times = nullptr;  // accumulated when set
  // A micro-batch after the first: a task that accumulates (Task::accumulates) adds into its
  // value, which holds the running sum.
  bool accumulate = false;
};

// Runs `tasks` once. `values` holds one tensor per value of the graph: the device's source
// shards on entry (kept), every other value it makes on exit unless a task released it.
void run_tasks(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
               std::vector<Tensor>& values, const TaskRunOptions& options);

// Runs one training step of `micro_batches` micro-batches: with one, run_tasks of every task;
// otherwise, per micro-batch m, each micro-batched input's shard of m (micro_inputs[v][m],
// graph/source.h's load_micro_batches) swapped into `values`, the per-micro-batch tasks, and
// the device's accumulated values (DeviceTasks::accumulated) summed (by the tasks that
// accumulate, in their kernels); then those sums divided by M (the mean over the micro-batches:
// the loss, the gradients) and the once-per-step tasks.
void run_step(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
              std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
              int micro_batches, TaskRunOptions options);

// Runs the forward tasks of one step (an evaluation: no gradient, no update, nothing that
// outlives the step changed), micro-batch by micro-batch as run_step does, the forward values
// accumulated over micro-batches (the loss) averaged. The values it made stay in `values` for
// the caller to read and drop. Every device runs its forward tasks in task order, so moves
// between stages match without a pipeline schedule.
void run_forward(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
                 std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
                 int micro_batches, TaskRunOptions options);

// Returns the Chrome / Perfetto trace JSON of `events`: a process per device with two tracks,
// "tasks" (every task, an overlapped loop's products nested in it) and "transfers" (the loops'
// block transfers), one complete event each with its phase and step, times relative to the
// earliest event.
std::string trace_json(const TaskGraph& graph, const std::vector<TraceEvent>& events);

}  // namespace meshflow
