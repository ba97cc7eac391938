// One device's task loop and the trace JSON.
#include "meshflow/runtime/task_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/ops/elementwise.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs one task's work; returns its kind for traces.
const char* run_work(const TaskGraph& graph, const Task& task, Communicator& world,
                     std::vector<Tensor>& values, double lr) {
  auto value = [&](ValueId v) -> Tensor& { return values[static_cast<std::size_t>(v)]; };
  if (const auto* c = std::get_if<ComputeTask>(&task.work)) {
    std::vector<const Tensor*> locals;
    locals.reserve(c->call->args.size());
    for (ValueId v : c->call->args) locals.push_back(&value(v));
    Tensor out = run_kernel(c->call->op, locals, c->call->globals);
    MESHFLOW_CHECK(out.shape() == c->local_out, "task \"{}\": kernel gave {}, expected {}",
                   graph.names[static_cast<std::size_t>(task.out)], to_string(out.shape()),
                   to_string(c->local_out));
    value(task.out) = std::move(out);
    return "compute";
  }
  if (const auto* m = std::get_if<MoveTask>(&task.work)) {
    const DeviceProgram& p = *m->program;
    Tensor none(p.dtype, Shape{0});
    Tensor out = execute(p, world, p.in_from ? value(m->input) : none);
    if (p.in_to) value(task.out) = std::move(out);
    return "move";
  }
  const auto& u = std::get<UpdateTask>(task.work);
  sgd_update(value(u.weight), value(u.grad), lr);
  return "update";
}

}  // namespace

void run_tasks(const TaskGraph& graph, const DeviceTasks& tasks, Communicator& world,
               std::vector<Tensor>& values, const TaskRunOptions& options) {
  MESHFLOW_CHECK(values.size() == graph.names.size());
  const double run_start = options.times ? now_s() : 0;
  std::vector<Event> done(tasks.tasks.size());
  for (std::size_t t = 0; t < tasks.tasks.size(); ++t) {
    const Task& task = tasks.tasks[t];
    std::vector<Event> deps;
    for (int d : task.deps) deps.push_back(done[static_cast<std::size_t>(d)]);
    when_all(deps).wait(world.default_timeout());
    auto state = std::make_shared<EventState>(graph.names[static_cast<std::size_t>(task.out)]);
    const bool timed = options.trace || options.times;
    const double start = timed ? now_s() : 0;
    const char* kind = nullptr;
    try {
      kind = run_work(graph, task, world, values, options.lr);
    } catch (...) {
      state->fail(std::current_exception());
      throw;
    }
    state->complete();
    done[t] = Event(std::move(state));
    if (timed) {
      const double end = now_s();
      if (options.trace) {
        options.trace->push_back(TraceEvent{.device = tasks.device,
                                            .value = task.out,
                                            .kind = kind,
                                            .phase = task.phase,
                                            .step = options.step,
                                            .start_s = start,
                                            .end_s = end});
      }
      if (options.times) {
        (std::string_view(kind) == "move" ? options.times->move_s : options.times->compute_s) +=
            end - start;
      }
    }
    for (ValueId v : task.release) values[static_cast<std::size_t>(v)] = Tensor();
  }
  if (options.times) options.times->total_s += now_s() - run_start;
}

std::string trace_json(const TaskGraph& graph, const std::vector<TraceEvent>& events) {
  double origin = events.empty() ? 0 : events.front().start_s;
  for (const TraceEvent& e : events) origin = std::min(origin, e.start_s);
  nlohmann::json out = nlohmann::json::array();
  std::set<DeviceId> devices;
  for (const TraceEvent& e : events) devices.insert(e.device);
  for (DeviceId d : devices) {
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", 0},
                   {"tid", d},
                   {"args", {{"name", fmt::format("device {}", d)}}}});
  }
  for (const TraceEvent& e : events) {
    out.push_back({{"name", graph.names[static_cast<std::size_t>(e.value)]},
                   {"cat", e.kind},
                   {"ph", "X"},
                   {"pid", 0},
                   {"tid", e.device},
                   {"ts", (e.start_s - origin) * 1e6},
                   {"dur", (e.end_s - e.start_s) * 1e6},
                   {"args", {{"phase", std::string(to_string(e.phase))}, {"step", e.step}}}});
  }
  return nlohmann::json{{"traceEvents", out}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace meshflow
