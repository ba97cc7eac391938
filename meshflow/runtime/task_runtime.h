// Runs one device's part of a task graph (graph/task_graph.h) over a Communicator: kernels on
// its shards, its part of every move through the plan executor, SGD updates in place. Each
// task starts once the events of the tasks it depends on are complete, and completes its own;
// tasks run in the graph's order, which every device of a move shares, so collectives match
// and results are identical run to run.
#pragma once

#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/graph/task_graph.h"

namespace meshflow {

// One task as it ran, for traces (seconds on the steady clock).
struct TraceEvent {
  DeviceId device = 0;
  ValueId value = 0;
  std::string kind;  // "compute", "move", "update"
  Phase phase = Phase::kForward;
  int step = 0;
  double start_s = 0, end_s = 0;
};

// Where a device's run accounts its time (for the train benchmark): kernels and updates,
// moves, and the whole run.
struct TaskTimes {
  double compute_s = 0, move_s = 0, total_s = 0;
};

struct TaskRunOptions {
  double lr = 0.1;                           // updates
  int step = 0;                              // recorded in trace events
  std::vector<TraceEvent>* trace = nullptr;  // appended to when set
  TaskTimes* times = nullptr;                // accumulated when set
};

// Runs `tasks` once. `values` holds one tensor per value of the graph: the device's source
// shards on entry (kept), every other value it makes on exit unless a task released it.
void run_tasks(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
               std::vector<Tensor>& values, const TaskRunOptions& options);

// Returns the Chrome / Perfetto trace JSON of `events`: one track (thread) per device, one
// complete event per task with its phase and step, times relative to the earliest event.
std::string trace_json(const TaskGraph& graph, const std::vector<TraceEvent>& events);

}  // namespace meshflow
