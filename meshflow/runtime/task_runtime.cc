// One device's task loop and the trace JSON.
#include "meshflow/runtime/task_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/float_mode.h"
#include "meshflow/kernels/optimizer.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/elementwise.h"
#include "meshflow/runtime/executor.h"
#include "meshflow/runtime/overlap.h"

namespace meshflow {

namespace {

// Runs an overlapped loop; appends its blocks' events to `blocks` when set.
void run_overlap(const OverlapTask& o, ValueId out, Communicator& world,
                 std::vector<Tensor>& values, std::vector<OverlapEvent>* blocks) {
  auto value = [&](ValueId v) -> Tensor& { return values[static_cast<std::size_t>(v)]; };
  const std::shared_ptr<Communicator> group = world.group(o.group);
  std::vector<const Tensor*> rest;
  for (std::size_t i = 1; i < o.call->args.size(); ++i) rest.push_back(&value(o.call->args[i]));
  OverlapOptions options{.form = o.decomposition.form, .events = blocks};
  Tensor result;
  if (o.decomposition.kind == Decomposition::Kind::kGatherOperand) {
    Tensor gathered;
    options.gathered = &gathered;
    result = allgather_product(*group, o.call->op, value(o.source), o.rows, rest, options);
    value(o.call->args[0]) = std::move(gathered);
  } else {
    result = product_reduce_scatter(*group, o.call->op, value(o.call->args[0]), rest, options);
  }
  MESHFLOW_CHECK(result.shape() == o.local_out, "overlapped loop gave {}, expected {}",
                 to_string(result.shape()), to_string(o.local_out));
  value(out) = std::move(result);
}

// Runs one task's work; returns its kind for traces. An asynchronous move is only started:
// `started` is its event.
TraceKind run_work(const TaskGraph& graph, const Task& task, Communicator& world,
                   std::vector<Tensor>& values, const TaskRunOptions& options,
                   std::vector<OverlapEvent>* blocks, Event& started) {
  auto value = [&](ValueId v) -> Tensor& { return values[static_cast<std::size_t>(v)]; };
  if (const auto* c = std::get_if<ComputeTask>(&task.work)) {
    if (task.reuses_input) {  // a reshape of a value this device drops after it
      value(task.out) = Tensor::reshaped(std::move(value(c->call->args[0])), c->local_out);
      return TraceKind::kCompute;
    }
    std::vector<const Tensor*> locals;
    locals.reserve(c->call->args.size());
    for (ValueId v : c->call->args) locals.push_back(&value(v));
    // The task's own kernel, and those fused into it: their ops, values and shapes in order.
    std::vector<Op> ops = {c->call->op};
    std::vector<std::pair<ValueId, const Shape*>> made = {{task.out, &c->local_out}};
    for (const FusedKernel& f : c->fused) {
      ops.push_back(f.op);
      made.emplace_back(f.out, &f.local_out);
    }
    std::vector<Tensor> outs;
    try {
      if (task.accumulates && options.accumulate) {
        run_kernel_accumulate(c->call->op, locals, c->call->globals, c->offsets, value(task.out));
        return TraceKind::kCompute;
      }
      outs = run_kernels(ops, locals, c->call->globals, c->offsets);
    } catch (const Error& e) {  // bad data (an id, a label): name the node that read it
      if (e.kind() == ErrorKind::kInternal) throw;
      fail(e.kind(), "node \"{}\": {}", graph.names[static_cast<std::size_t>(task.out)], e.what());
    }
    for (std::size_t i = 0; i < made.size(); ++i) {
      const auto [v, shape] = made[i];
      MESHFLOW_CHECK(outs[i].shape() == *shape, "task \"{}\": kernel gave {}, expected {}",
                     graph.names[static_cast<std::size_t>(v)], to_string(outs[i].shape()),
                     to_string(*shape));
      value(v) = std::move(outs[i]);
    }
    return TraceKind::kCompute;
  }
  if (const auto* m = std::get_if<MoveTask>(&task.work)) {
    const DeviceProgram& p = *m->program;
    Tensor none(p.dtype, Shape{0});
    if (task.asynchronous) {
      StartedMove s = start(p, world, p.in_from ? value(m->input) : none);
      if (p.in_to) value(task.out) = std::move(s.out);
      started = std::move(s.done);
      return TraceKind::kMove;
    }
    Tensor out = execute(p, world, p.in_from ? value(m->input) : none);
    if (p.in_to) value(m->replaces ? *m->replaces : task.out) = std::move(out);
    return TraceKind::kMove;
  }
  if (const auto* o = std::get_if<OverlapTask>(&task.work)) {
    run_overlap(*o, task.out, world, values, blocks);
    return TraceKind::kOverlap;
  }
  if (const auto* n = std::get_if<GradNormTask>(&task.work)) {
    double term = 0;
    for (const NormTerm& t : n->counted) {
      const Tensor& shard = value(t.value);
      term += sum_of_squares(shard, part_begin(shard.numel(), t.parts, t.part, 1),
                             part_begin(shard.numel(), t.parts, t.part + 1, 1));
    }
    if (n->loss && !std::isfinite(sum_of_squares(value(*n->loss))))
      term = std::numeric_limits<double>::quiet_NaN();
    Tensor out(DType::kFloat64, Shape{});
    out.data<double>()[0] = term;
    value(task.out) = std::move(out);
    return TraceKind::kUpdate;
  }
  const auto& u = std::get<UpdateTask>(task.work);
  const double norm_sq = value(u.norm).data<double>()[0];
  if (!std::isfinite(norm_sq) && !options.allow_nonfinite) return TraceKind::kUpdate;
  std::vector<Tensor*> state;
  for (ValueId v : u.state) state.push_back(&value(v));
  update_shard(
      u.rule,
      {.lr = options.lr, .step = options.step, .grad_scale = clip_coefficient(u.rule, norm_sq)},
      value(u.weight), value(u.grad), state);
  return TraceKind::kUpdate;
}

// Swaps micro-batch m of every micro-batched input between `micro_inputs` and `values`: once
// to run it, once more to put it back.
void swap_micro_batch(std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
                      int m) {
  for (std::size_t v = 0; v < micro_inputs.size(); ++v)
    if (!micro_inputs[v].empty())
      std::swap(values[v], micro_inputs[v][static_cast<std::size_t>(m)]);
}

}  // namespace

void run_tasks(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
               std::vector<Tensor>& values, const TaskRunOptions& options) {
  MESHFLOW_CHECK(values.size() == graph.names.size());
  const FlushDenormals flush;
  const double run_start = options.times ? steady_seconds() : 0;
  std::vector<Event> done(tasks.tasks.size());
  std::vector<Event> running;  // the asynchronous moves started
  // While micro-batches run, what they accumulate outlives them (a fetch later in the order may
  // hold its release).
  std::vector<bool> accumulated(values.size(), false);
  if (options.part == TaskPart::kMicroBatch)
    for (ValueId v : tasks.accumulated) accumulated[static_cast<std::size_t>(v)] = true;
  // The tasks this call runs, in order.
  std::vector<int> order;
  std::vector<bool> selected(tasks.tasks.size(), false);
  if (options.only) {
    order = *options.only;
  } else {
    for (std::size_t t = 0; t < tasks.tasks.size(); ++t) {
      const Task& task = tasks.tasks[t];
      if (options.part == TaskPart::kAll ||
          task.once_per_step == (options.part == TaskPart::kOncePerStep))
        order.push_back(static_cast<int>(t));
    }
  }
  for (int t : order) selected[static_cast<std::size_t>(t)] = true;
  for (int ti : order) {
    const auto t = static_cast<std::size_t>(ti);
    const Task& task = tasks.tasks[t];
    std::vector<Event> deps;
    for (int d : task.deps) {
      // A dependency outside this call ran in an earlier one (micro-batches before the step's
      // once-per-step tasks, a stage's forward group before its backward one).
      if (selected[static_cast<std::size_t>(d)]) deps.push_back(done[static_cast<std::size_t>(d)]);
    }
    const bool timed = options.trace || options.times;
    // Waiting for a started move (a prefetched gather) is that move's time.
    const double waiting = timed ? steady_seconds() : 0;
    when_all(deps).wait(world.default_timeout());
    if (options.times) options.times->move_s += steady_seconds() - waiting;
    auto state = std::make_shared<EventState>(graph.names[static_cast<std::size_t>(task.out)]);
    const double start = timed ? steady_seconds() : 0;
    const double cpu_start = options.trace ? thread_cpu_seconds() : 0;
    std::vector<OverlapEvent> blocks;
    TraceKind kind = TraceKind::kCompute;
    Event started;
    try {
      const TaggedMove* tagged = nullptr;
      if (options.tagged) {
        if (auto it = options.tagged->find(ti); it != options.tagged->end()) tagged = &it->second;
      }
      if (tagged) {
        const auto& move = std::get<MoveTask>(task.work);
        const int tag = tagged->tag + options.micro_batch;
        if (tagged->sends) {
          for (auto& [data, event] :
               send_tagged(*move.program, world, values[static_cast<std::size_t>(move.input)], tag))
            options.sending->push_back({std::move(data), std::move(event)});
          values[static_cast<std::size_t>(task.out)] = Tensor(move.program->dtype, Shape{0});
        } else {
          values[static_cast<std::size_t>(task.out)] = receive_tagged(*move.program, world, tag);
        }
        kind = TraceKind::kMove;
      } else {
        kind = run_work(graph, task, world, values, options, timed ? &blocks : nullptr, started);
      }
    } catch (...) {
      state->fail(std::current_exception());
      throw;
    }
    state->complete();
    done[t] = task.asynchronous ? started : Event(std::move(state));
    if (task.asynchronous) running.push_back(started);
    if (options.memory) {
      std::vector<std::int64_t> bytes(values.size());
      for (std::size_t v = 0; v < values.size(); ++v)
        bytes[v] = static_cast<std::int64_t>(values[v].nbytes());
      options.memory->observe(bytes, options.beside);
    }
    if (timed) {
      const double end = steady_seconds();
      auto event = [&](TraceKind k, int block, double from, double to) {
        return TraceEvent{.device = tasks.device,
                          .value = task.out,
                          .kind = k,
                          .phase = task.phase,
                          .step = options.step,
                          .block = block,
                          .start_s = from,
                          .end_s = to};
      };
      if (options.trace) {
        TraceEvent whole = event(kind, -1, start, end);
        whole.cpu_s = thread_cpu_seconds() - cpu_start;
        options.trace->push_back(whole);
        for (const OverlapEvent& b : blocks) {
          const bool transfer = b.kind == OverlapEvent::Kind::kTransfer;
          options.trace->push_back(event(transfer ? TraceKind::kTransfer : TraceKind::kProduct,
                                         b.block, b.start_s, b.end_s));
        }
      }
      if (options.times) {
        double products = 0;
        for (const OverlapEvent& b : blocks)
          if (b.kind == OverlapEvent::Kind::kProduct) products += b.end_s - b.start_s;
        const bool moves = kind == TraceKind::kMove || kind == TraceKind::kOverlap;
        (moves ? options.times->move_s : options.times->compute_s) += end - start - products;
        options.times->compute_s += products;
        if (kind == TraceKind::kUpdate) options.times->update_s += end - start;
      }
    }
    for (ValueId v : task.release)
      if (!accumulated[static_cast<std::size_t>(v)]) values[static_cast<std::size_t>(v)] = Tensor();
  }
  // Every started move has a reader in this part; a failure still surfaces here.
  when_all(running).wait(world.default_timeout());
  if (options.times) options.times->total_s += steady_seconds() - run_start;
}

void run_step(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
              std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
              int micro_batches, TaskRunOptions options) {
  if (micro_batches == 1) {
    options.part = TaskPart::kAll;
    run_tasks(graph, tasks, world, values, options);
    return;
  }
  // The micro-batches wait in micro_inputs; the one running is swapped into `values`.
  for (std::size_t v = 0; v < micro_inputs.size(); ++v)
    if (!micro_inputs[v].empty()) values[v] = Tensor();
  const std::vector<MemoryKind>* kinds = options.memory ? &options.memory->kinds() : nullptr;
  std::vector<Tensor> sums(tasks.accumulated.size());
  // Returns the bytes held beside the values: the caller's (a checkpoint's snapshot), the
  // waiting micro-batches and the sums.
  const MemoryBreakdown base = options.beside;
  auto beside = [&] {
    MemoryBreakdown b = base;
    if (!kinds) return b;
    for (std::size_t v = 0; v < micro_inputs.size(); ++v)
      for (const Tensor& t : micro_inputs[v])
        b[(*kinds)[v]] += static_cast<std::int64_t>(t.nbytes());
    for (std::size_t i = 0; i < sums.size(); ++i)
      b[(*kinds)[static_cast<std::size_t>(tasks.accumulated[i])]] +=
          static_cast<std::int64_t>(sums[i].nbytes());
    return b;
  };
  // Sums a task accumulates into stay in `values` while its micro-batch runs.
  const std::vector<bool> in_place = accumulated_in_place(tasks);
  for (int m = 0; m < micro_batches; ++m) {
    swap_micro_batch(values, micro_inputs, m);
    for (std::size_t i = 0; i < sums.size(); ++i)
      if (m > 0 && in_place[i])
        values[static_cast<std::size_t>(tasks.accumulated[i])] = std::exchange(sums[i], Tensor());
    options.part = TaskPart::kMicroBatch;
    options.accumulate = m > 0;
    options.beside = beside();
    run_tasks(graph, tasks, world, values, options);
    swap_micro_batch(values, micro_inputs, m);
    for (std::size_t i = 0; i < sums.size(); ++i) {
      Tensor& made = values[static_cast<std::size_t>(tasks.accumulated[i])];
      MESHFLOW_CHECK(m == 0 || in_place[i] || made.shape() == sums[i].shape(),
                     "device {}: micro-batch {} made \"{}\" of {}, the first {}", tasks.device, m,
                     graph.names[static_cast<std::size_t>(tasks.accumulated[i])],
                     to_string(made.shape()), to_string(sums[i].shape()));
      if (m == 0 || in_place[i]) {
        sums[i] = std::exchange(made, Tensor());
      } else {
        add_into(sums[i], made);
      }
    }
  }
  options.accumulate = false;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    scale_in_place(sums[i], 1.0 / micro_batches);
    values[static_cast<std::size_t>(tasks.accumulated[i])] = std::exchange(sums[i], Tensor());
  }
  options.part = TaskPart::kOncePerStep;
  options.beside = beside();
  run_tasks(graph, tasks, world, values, options);
}

void run_forward(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
                 std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
                 int micro_batches, TaskRunOptions options) {
  std::vector<int> all, per_micro_batch, once;
  std::vector<Phase> made_in(values.size(), Phase::kUpdate);
  for (std::size_t t = 0; t < tasks.tasks.size(); ++t) {
    const Task& task = tasks.tasks[t];
    made_in[static_cast<std::size_t>(task.out)] = task.phase;
    if (task.phase != Phase::kForward) continue;
    all.push_back(static_cast<int>(t));
    (task.once_per_step ? once : per_micro_batch).push_back(static_cast<int>(t));
  }
  options.accumulate = false;
  if (micro_batches == 1) {
    options.part = TaskPart::kAll;
    options.only = &all;
    run_tasks(graph, tasks, world, values, options);
    return;
  }
  // The forward values accumulated over micro-batches, summed here (no kernel adds in place:
  // accumulate is off).
  std::vector<ValueId> summed;
  for (ValueId v : tasks.accumulated)
    if (made_in[static_cast<std::size_t>(v)] == Phase::kForward) summed.push_back(v);
  std::vector<Tensor> sums(summed.size());
  for (int m = 0; m < micro_batches; ++m) {
    swap_micro_batch(values, micro_inputs, m);
    options.part = TaskPart::kMicroBatch;
    options.only = &per_micro_batch;
    run_tasks(graph, tasks, world, values, options);
    swap_micro_batch(values, micro_inputs, m);
    for (std::size_t i = 0; i < summed.size(); ++i) {
      Tensor& made = values[static_cast<std::size_t>(summed[i])];
      if (m == 0) {
        sums[i] = std::exchange(made, Tensor());
      } else {
        add_into(sums[i], made);
        made = Tensor();
      }
    }
  }
  for (std::size_t i = 0; i < summed.size(); ++i) {
    scale_in_place(sums[i], 1.0 / micro_batches);
    values[static_cast<std::size_t>(summed[i])] = std::exchange(sums[i], Tensor());
  }
  options.part = TaskPart::kOncePerStep;
  options.only = &once;
  run_tasks(graph, tasks, world, values, options);
}

std::string_view to_string(TraceKind kind) {
  switch (kind) {
    case TraceKind::kCompute:
      return "compute";
    case TraceKind::kMove:
      return "move";
    case TraceKind::kUpdate:
      return "update";
    case TraceKind::kOverlap:
      return "overlap";
    case TraceKind::kTransfer:
      return "transfer";
    case TraceKind::kProduct:
      return "product";
    case TraceKind::kGroup:
      return "group";
  }
  return "?";
}

std::string trace_json(const TaskGraph& graph, const std::vector<TraceEvent>& events) {
  constexpr int kTasks = 0, kTransfers = 1;  // each device's tracks
  double origin = events.empty() ? 0 : events.front().start_s;
  for (const TraceEvent& e : events) origin = std::min(origin, e.start_s);
  nlohmann::json out = nlohmann::json::array();
  std::set<DeviceId> devices;
  for (const TraceEvent& e : events) devices.insert(e.device);
  auto meta = [](const char* what, DeviceId d, int tid, std::string name) {
    return nlohmann::json{
        {"name", what}, {"ph", "M"}, {"pid", d}, {"tid", tid}, {"args", {{"name", name}}}};
  };
  for (DeviceId d : devices) {
    out.push_back(meta("process_name", d, kTasks, fmt::format("device {}", d)));
    out.push_back(meta("thread_name", d, kTasks, "tasks"));
    out.push_back(meta("thread_name", d, kTransfers, "transfers"));
  }
  for (const TraceEvent& e : events) {
    nlohmann::json args = {{"phase", std::string(to_string(e.phase))}, {"step", e.step}};
    if (e.block >= 0) args["block"] = e.block;
    const std::string name = e.kind == TraceKind::kGroup
                                 ? fmt::format("{}{}", e.group, e.micro_batch)
                                 : graph.names[static_cast<std::size_t>(e.value)];
    if (e.kind == TraceKind::kGroup) args["micro_batch"] = e.micro_batch;
    if (e.cpu_s >= 0) args["cpu_ms"] = e.cpu_s * 1e3;
    out.push_back({{"name", name},
                   {"cat", std::string(to_string(e.kind))},
                   {"ph", "X"},
                   {"pid", e.device},
                   {"tid", e.kind == TraceKind::kTransfer ? kTransfers : kTasks},
                   {"ts", (e.start_s - origin) * 1e6},
                   {"dur", (e.end_s - e.start_s) * 1e6},
                   {"args", args}});
  }
  return nlohmann::json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace meshflow
