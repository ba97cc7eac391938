// Time of a training step per device (DESIGN's "Estimates", est_step_s): every task of a task
// graph priced by the one cost model (plan/cost_model.h) the planner and overlap use: a kernel
// by its work points and the bytes it reads and writes, a move by its plan's estimate (and,
// where the device computed since it last met its peers, the machine's collective_sync_us), a
// decomposed collective by its loop's timeline, the optimizer's update and the gradient norm by
// the bytes they stream; the per-micro-batch tasks counted once per micro-batch with the
// accumulation of their gradients.
#pragma once

#include <vector>

#include "meshflow/graph/task_graph.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/plan_cache.h"

namespace meshflow {

// A device's estimated seconds of one step, by what the runtime's TaskTimes counts them as:
// compute (kernels, a decomposed loop's products, the accumulation of micro-batch gradients),
// moves (plans, a decomposed loop's exposed transfers) and the optimizer (updates and the
// gradient norm's term).
struct StepTime {
  DeviceId device = 0;
  double compute_s = 0, move_s = 0, update_s = 0;
  double total() const { return compute_s + move_s + update_s; }
};

// Returns the estimated seconds of `task` on `device` (a task of that device in `g`, the task
// graph of compiled graph `pcg`), split as StepTime splits them (device left 0).
StepTime task_time(const Pcg& pcg, const TaskGraph& g, const Task& task, DeviceId device,
                   const MachineModel& machine, PlanCache& plans);

// Returns each device's estimated seconds of one step of `micro_batches` micro-batches, in g's
// device order, each device computing with `threads_per_device` threads (0: the default):
// compute and updates take core_sharing times as long as on one core of their own. The step's time
// is the slowest device's: the collectives make every device wait for the others.
std::vector<StepTime> estimate_step_time(const Pcg& pcg, const TaskGraph& g, int micro_batches,
                                         const PlanOptions& options, int threads_per_device = 0);

// Returns the largest total of `times` (0 for none).
double slowest(const std::vector<StepTime>& times);

}  // namespace meshflow
