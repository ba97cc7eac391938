// Shard expansion: a laid-out, copied PCG (Stage::kCopied) becomes a task graph, the boundary
// between compiler and runtime. Per device it lists, in the order the device runs them, the
// tasks it takes part in: a kernel on its shards, its part of a move (a lowered plan,
// plan/lower.h), its term of the gradient norm, or the optimizer's update of its weight shard; each
// with the earlier tasks it depends on and the values it no longer needs afterwards. Plain data:
// the runtime only executes it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "meshflow/graph/pcg.h"
#include "meshflow/plan/lower.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

// What every device runs for one compute node: run_kernel(op, args' shards, globals).
struct KernelCall {
  Op op;  // normalised
  std::vector<TensorSpec> globals;
  std::vector<ValueId> args;
  bool operator==(const KernelCall&) const = default;
};

// Another node's kernel run in the same pass as a compute task's own (ops/op.h's run_kernels:
// attention's gradients, which share their probabilities; layer norm's scale and bias gradients,
// one pass over g): it reads the first arity(op) of the call's operands and makes a shard of
// local_out of value `out`.
struct FusedKernel {
  ValueId out = 0;
  Op op;  // normalised
  Shape local_out;
  bool operator==(const FusedKernel&) const = default;
};

// The node's kernel on this device's shards -> a shard of local_out (and with `fused`, the other
// nodes' shards too, from one run_kernels). The call is shared by every device of the node (a
// task graph of 64 devices holds it once).
struct ComputeTask {
  std::shared_ptr<const KernelCall> call;
  Shape local_out;
  ShardOffsets offsets;  // where this device's argument shards start (run_kernel's)
  std::vector<FusedKernel> fused;
  bool operator==(const ComputeTask& o) const {
    return *call == *o.call && local_out == o.local_out && offsets == o.offsets && fused == o.fused;
  }
};

// execute(program, input's local shard) -> the output's local shard. Moves with the same plan
// share one program per device. With `replaces` (Node::replaces, ZeRO-1) the output becomes
// that weight's shard instead of a value of its own (the input is the updated chunk the update
// wrote in place).
struct MoveTask {
  ValueId input = 0;
  std::shared_ptr<const DeviceProgram> program;
  std::optional<ValueId> replaces;
  bool operator==(const MoveTask& o) const {
    return input == o.input && *program == *o.program && replaces == o.replaces;
  }
};

// A row product and the collective beside it, run as one overlapped loop (Node::decomposed,
// runtime/overlap.h) over `group`, this device's devices along the decomposition's mesh dim in
// coordinate order (its ranks). kGatherOperand: reads `source`'s shard (the value the movement
// gathers) and the call's other operands; makes the product (the task's value, local_out) and
// call->args[0], operand 0 gathered. kScatterResult: reads the call's operands; makes the
// movement's value (the task's, local_out); the product's own Partial value is never made.
struct OverlapTask {
  std::shared_ptr<const KernelCall> call;  // the product
  Decomposition decomposition;
  ValueId source = 0;  // kGatherOperand
  std::vector<DeviceId> group;
  std::int64_t rows = 0;  // kGatherOperand: dim 0 of operand 0 gathered on this device
  Shape local_out;
  bool operator==(const OverlapTask& o) const {
    return *call == *o.call && decomposition == o.decomposition && source == o.source &&
           group == o.group && rows == o.rows && local_out == o.local_out;
  }
};

// The optimizer's step on this device's shards of a weight and its state, in place (the output
// value is the weight): update_shard (kernels/optimizer.h) with the gradient scaled by
// clip_coefficient of the squared norm `norm`, skipped when that norm is not finite unless the
// run allows non-finite steps.
struct UpdateTask {
  ValueId weight = 0, grad = 0, norm = 0;
  std::vector<ValueId> state;  // state_names(rule)'s order
  UpdateRule rule;
  bool operator==(const UpdateTask&) const = default;
};

// A gradient shard a device counts in the squared norm: of the `parts` devices holding copies of
// it (the devices that differ only on mesh dims where the gradient is Replicate), this device
// counts part `part` of its elements, [part_begin(n, parts, part), part_begin(n, parts, part + 1))
// (kernels/parallel.h, align 1), so each element is counted once and the replicas share the work.
struct NormTerm {
  ValueId value = 0;
  int part = 0, parts = 1;
  bool operator==(const NormTerm&) const = default;
};

// This device's term of the squared global gradient norm: the sum of squares of its parts of the
// gradient shards (`counted`), NaN when it holds a shard of the loss (`loss`) that is not finite.
struct GradNormTask {
  std::vector<NormTerm> counted;
  std::optional<ValueId> loss;
  bool operator==(const GradNormTask&) const = default;
};

struct Task {
  ValueId out = 0;  // the node this task runs (its value)
  Phase phase = Phase::kForward;
  std::variant<ComputeTask, MoveTask, UpdateTask, GradNormTask, OverlapTask> work;
  std::vector<int> deps;         // indices of earlier tasks of this device
  std::vector<ValueId> release;  // values this device drops after the task
  // Runs once per step after every micro-batch's tasks (the update phase and what reads its
  // results); the other tasks run once per micro-batch.
  bool once_per_step = false;
  // A kernel whose value is accumulated over micro-batches (DeviceTasks::accumulated) and read
  // by no other per-micro-batch task: after the first micro-batch it adds into the running sum
  // (run_kernel_accumulate: a product in its GEMM) instead of making a value to add.
  bool accumulates = false;
  // A reshape whose input this device drops right after it (released, not accumulated): the
  // runtime hands the input's buffer to the result (Tensor::reshaped) instead of copying it.
  bool reuses_input = false;
  // A move the runtime starts and leaves running (runtime/executor.h's start): the tasks that
  // read its value wait for it through their deps. ZeRO-3's weight gathers, each issued before
  // the node ahead of its reader runs so the two overlap (Node::zero_gather).
  bool asynchronous = false;
  bool operator==(const Task&) const = default;
};

// Which of a device's tasks a run runs (Task::once_per_step): all of them (one micro-batch per
// step), or one micro-batch's tasks, or the once-per-step tasks after every micro-batch's ran.
enum class TaskPart { kAll, kMicroBatch, kOncePerStep };

struct DeviceTasks {
  DeviceId device = 0;
  std::vector<ValueId> sources;  // the sources this device holds a shard of, loaded once
  std::vector<Task> tasks;
  // Floating-point values the per-micro-batch tasks make that a once-per-step task reads or
  // the caller keeps (gradients, the loss): averaged over the micro-batches of a step, and
  // never dropped by a per-micro-batch task while micro-batches run.
  std::vector<ValueId> accumulated;
  bool operator==(const DeviceTasks&) const = default;
};

struct TaskGraph {
  std::vector<DeviceTasks> devices;  // ascending device id: every device of every layout
  std::vector<std::string> names;    // per value (node names, for traces and text)
  std::vector<Layout> layouts;       // per value
  bool operator==(const TaskGraph&) const = default;
};

// Returns the task graph of `pcg` (Stage::kCopied). Values in `keep` (and sources) are never
// released; every other value is dropped after its last use on each device.
TaskGraph expand_shards(const Pcg& pcg, const std::vector<ValueId>& keep,
                        const PlanOptions& options = {});

// Returns the task graph as text, one task per line per device (golden tests).
std::string to_text(const TaskGraph& graph);

// Returns, per value of dt.accumulated (in its order), whether a task of dt adds into that
// value's running sum in its kernel (Task::accumulates) rather than making a value to add.
std::vector<bool> accumulated_in_place(const DeviceTasks& dt);

// Returns the values `task` reads (an update: its weight, gradient, norm and state). The second
// form fills `reads` (cleared first), reusing its storage across tasks.
std::vector<ValueId> task_reads(const Task& task);
void task_reads(const Task& task, std::vector<ValueId>& reads);

// Returns whether `task` makes a new value on its device: a move only on its destination's
// devices; an update writes its weight in place and makes none, and a move that replaces a
// weight makes none either.
bool makes_value(const Task& task);

// Returns the values `task` makes on its device: its own where makes_value, and those of the
// kernels fused into it and a decomposed gather's operand 0 as gathered. The second form fills
// `made` (cleared first).
std::vector<ValueId> values_made(const Task& task);
void values_made(const Task& task, std::vector<ValueId>& made);

// Returns the values `task` writes in place: an update's weight (or chunk) and state, the
// weight a move replaces; none for other tasks.
std::vector<ValueId> writes_in_place(const Task& task);

// Returns the bytes of value v's shard on `device` (0 where the device holds none).
std::int64_t shard_bytes(const TaskGraph& g, ValueId v, DeviceId device);

// Returns the devices of every layout of `pcg`, ascending.
std::vector<DeviceId> pcg_devices(const Pcg& pcg);

}  // namespace meshflow
