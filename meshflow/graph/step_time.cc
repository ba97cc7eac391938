// The step-time estimate: each task priced by the cost model, summed per device.
#include "meshflow/graph/step_time.h"

#include <algorithm>

#include "meshflow/graph/passes.h"
#include "meshflow/ops/op.h"

namespace meshflow {

namespace {

// Returns the bytes of value v's shard on `device` as a double (0 where it holds none).
double bytes_of(const TaskGraph& g, ValueId v, DeviceId device) {
  return static_cast<double>(shard_bytes(g, v, device));
}

// Returns the compute node of `pcg` decomposed as `d`.
const Node& decomposed_product(const Pcg& pcg, const Decomposition& d) {
  const auto it = std::find_if(pcg.nodes.begin(), pcg.nodes.end(),
                               [&](const Node& n) { return n.decomposed && *n.decomposed == d; });
  MESHFLOW_CHECK(it != pcg.nodes.end(), "an overlap task whose product is not in the graph");
  return *it;
}

// Returns the plan of move task `task`: its node's input layout to its own.
std::shared_ptr<const Plan> move_plan(const Pcg& pcg, const Task& task, PlanCache& plans) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(task.out)];
  const Layout& from = *pcg.nodes[static_cast<std::size_t>(n.inputs[0])].layout;
  return plans.get(from, *n.layout);
}

// Returns whether `task` is a move that every device of its groups waits in: a plan with a step
// that communicates, not started and left running (Task::asynchronous).
bool meets_peers(const Pcg& pcg, const Task& task, PlanCache& plans) {
  if (!std::holds_alternative<MoveTask>(task.work) || task.asynchronous) return false;
  const std::shared_ptr<const Plan> plan = move_plan(pcg, task, plans);
  return std::any_of(plan->steps.begin(), plan->steps.end(),
                     [](const Step& s) { return s.kind != StepKind::kLocal; });
}

}  // namespace

StepTime task_time(const Pcg& pcg, const TaskGraph& g, const Task& task, DeviceId device,
                   const MachineModel& machine, PlanCache& plans) {
  StepTime t;
  if (const auto* c = std::get_if<ComputeTask>(&task.work)) {
    if (task.reuses_input) return t;  // a reshape that takes its input's buffer: no work
    std::vector<Shape> local;
    double bytes = bytes_of(g, task.out, device);
    for (ValueId a : c->call->args) {
      local.push_back(local_shape(g.layouts[static_cast<std::size_t>(a)], device));
      bytes += bytes_of(g, a, device);
    }
    // The task's own kernel and those fused into it (one op alone: its work_points).
    std::vector<Op> ops = {c->call->op};
    std::vector<Shape> outs = {c->local_out};
    for (const FusedKernel& f : c->fused) {
      ops.push_back(f.op);
      outs.push_back(f.local_out);
      bytes += bytes_of(g, f.out, device);
    }
    t.compute_s =
        kernel_seconds(machine, work_points(ops, c->call->globals, local, outs, c->offsets), bytes);
    return t;
  }
  if (std::holds_alternative<MoveTask>(task.work)) {
    t.move_s = move_plan(pcg, task, plans)->est_s;
    return t;
  }
  if (const auto* o = std::get_if<OverlapTask>(&task.work)) {
    const Node& product = decomposed_product(pcg, o->decomposition);
    const OverlapCostInput input = overlap_cost_input(pcg, product, o->decomposition);
    const OverlapEstimate e = o->decomposition.kind == Decomposition::Kind::kGatherOperand
                                  ? gather_overlap(machine, input, o->decomposition.form)
                                  : reduce_scatter_overlap(machine, input, o->decomposition.form);
    // As the runtime counts a loop: its products are compute, the rest of it the move's.
    t.compute_s = e.product_s;
    t.move_s = std::max(0.0, e.overlapped_s - e.product_s);
    return t;
  }
  if (const auto* n = std::get_if<GradNormTask>(&task.work)) {
    double bytes = 0;
    for (const NormTerm& c : n->counted) bytes += bytes_of(g, c.value, device) / c.parts;
    // One pass that only reads them.
    t.update_s = streaming_seconds(machine, bytes);
    return t;
  }
  const auto& u = std::get<UpdateTask>(task.work);
  // One fused pass (kernels/optimizer.h): reads the gradient, reads and writes the weight and
  // each state tensor.
  const double weight = bytes_of(g, u.weight, device);
  t.update_s =
      streaming_seconds(machine, bytes_of(g, u.grad, device) +
                                     2 * weight * (1 + static_cast<double>(u.state.size())));
  return t;
}

std::vector<StepTime> estimate_step_time(const Pcg& pcg, const TaskGraph& g, int micro_batches,
                                         const PlanOptions& options, int threads_per_device) {
  MESHFLOW_CHECK(micro_batches >= 1);
  const MachineModel& machine = options.machine ? *options.machine : default_machine();
  PlanCache plans(options);
  // Devices that take turns on the cores compute that much slower (moves are priced by links
  // measured with every device running).
  const double sharing =
      core_sharing(machine, static_cast<std::int64_t>(g.devices.size()), threads_per_device);
  std::vector<StepTime> out;
  const double sync_s = machine.collective_sync_us * 1e-6;
  for (const DeviceTasks& dt : g.devices) {
    StepTime step{.device = dt.device};
    double worked_s = 0;  // the device's work since it last waited for its peers
    for (const Task& task : dt.tasks) {
      const StepTime t = task_time(pcg, g, task, dt.device, machine, plans);
      const double times = task.once_per_step ? 1 : micro_batches;
      step.compute_s += times * t.compute_s;
      step.move_s += times * t.move_s;
      step.update_s += times * t.update_s;
      worked_s += t.compute_s * sharing + t.update_s;
      if (sync_s > 0 && meets_peers(pcg, task, plans)) {
        // The devices come to it apart, by at most what they did since they last met.
        step.move_s += times * std::min(sync_s, worked_s);
        worked_s = 0;
      }
    }
    if (micro_batches > 1) {
      // The runtime sums each accumulated value over the micro-batches: a task that
      // accumulates reads the sum beside its work (a GEMM's beta = 1), another's value is
      // added in (an add that reads two and writes one); then it scales each sum once.
      double added = 0, read = 0, all = 0;
      const std::vector<bool> in_place = accumulated_in_place(dt);
      for (std::size_t i = 0; i < dt.accumulated.size(); ++i) {
        const double b = bytes_of(g, dt.accumulated[i], dt.device);
        (in_place[i] ? read : added) += b;
        all += b;
      }
      step.compute_s +=
          kernel_seconds(machine, 0, (micro_batches - 1) * (3 * added + read) + 2 * all);
    }
    step.compute_s *= sharing;  // the update's memcpy rate has the sharing in it
    out.push_back(step);
  }
  return out;
}

double slowest(const std::vector<StepTime>& times) {
  double s = 0;
  for (const StepTime& t : times) s = std::max(s, t.total());
  return s;
}

}  // namespace meshflow
