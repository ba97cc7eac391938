// Order of work on every device: agree on what to run (under mpi, before any collective), load
// the device's source shards, stage the save folder (the leader), run the task graph (once per
// step, then a barrier so a step's time is every device's), write its saved shards, gather the
// trace, and publish (the leader). The leader is device 0 under mpi (world rank 0 prints) and
// the lowest device of the meshes under threads; the values it reports reach it by fetch moves
// appended to the graph (to a one-device mesh of the leader, Replicate).
#include "meshflow/runtime/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <optional>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/source.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/plan/plan_cache.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// Returns every device's trace events on every device (one all-gather of counts, one of data).
std::vector<TraceEvent> gather_events(Communicator& world, const std::vector<TraceEvent>& mine) {
  constexpr std::size_t kFields = 11;
  std::vector<double> packed;
  for (const TraceEvent& e : mine) {
    packed.insert(packed.end(),
                  {static_cast<double>(e.device), static_cast<double>(e.value),
                   static_cast<double>(e.kind), static_cast<double>(e.phase),
                   static_cast<double>(e.step), static_cast<double>(e.block), e.start_s, e.end_s,
                   static_cast<double>(e.group), static_cast<double>(e.micro_batch), e.cpu_s});
  }
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<std::int64_t> counts(n);
  const auto count = static_cast<std::int64_t>(packed.size());
  all_gather(world, {.send = reinterpret_cast<const std::byte*>(&count),
                     .recv = reinterpret_cast<std::byte*>(counts.data()),
                     .recv_counts = std::vector<std::int64_t>(n, 1),
                     .dtype = DType::kInt64});
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  std::vector<double> all(static_cast<std::size_t>(total));
  all_gather(world, {.send = reinterpret_cast<const std::byte*>(packed.data()),
                     .recv = reinterpret_cast<std::byte*>(all.data()),
                     .recv_counts = counts,
                     .dtype = DType::kFloat64});
  std::vector<TraceEvent> out;
  for (std::size_t i = 0; i + kFields <= all.size(); i += kFields) {
    out.push_back(TraceEvent{.device = static_cast<DeviceId>(all[i]),
                             .value = static_cast<ValueId>(all[i + 1]),
                             .kind = static_cast<TraceKind>(static_cast<int>(all[i + 2])),
                             .phase = static_cast<Phase>(static_cast<int>(all[i + 3])),
                             .step = static_cast<int>(all[i + 4]),
                             .block = static_cast<int>(all[i + 5]),
                             .start_s = all[i + 6],
                             .end_s = all[i + 7],
                             .group = static_cast<char>(all[i + 8]),
                             .micro_batch = static_cast<int>(all[i + 9]),
                             .cpu_s = all[i + 10]});
  }
  return out;
}

// Returns every rank's `mine` (records of one length on every rank), in rank order: one
// all-gather.
std::vector<std::int64_t> gather_records(Communicator& world,
                                         const std::vector<std::int64_t>& mine) {
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<std::int64_t> all(n * mine.size());
  all_gather(world,
             {.send = reinterpret_cast<const std::byte*>(mine.data()),
              .recv = reinterpret_cast<std::byte*>(all.data()),
              .recv_counts = std::vector<std::int64_t>(n, static_cast<std::int64_t>(mine.size())),
              .dtype = DType::kInt64});
  return all;
}

// Returns the device whose peak is the highest of every device's `mine` (one all-gather).
DeviceMemory highest_peak(Communicator& world, DeviceMemory mine) {
  mine.device = world.device();
  constexpr std::size_t kFields = 2 + std::tuple_size_v<decltype(MemoryBreakdown::bytes)>;
  std::vector<std::int64_t> packed = {mine.device, mine.peak};
  packed.insert(packed.end(), mine.at_peak.bytes.begin(), mine.at_peak.bytes.end());
  const std::vector<std::int64_t> all = gather_records(world, packed);
  const auto n = static_cast<std::size_t>(world.size());
  DeviceMemory best;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t* f = &all[r * kFields];
    if (r > 0 && f[1] <= best.peak) continue;
    best.device = static_cast<DeviceId>(f[0]);
    best.peak = f[1];
    std::copy(f + 2, f + kFields, best.at_peak.bytes.begin());
  }
  return best;
}

// Returns every stage device's peaks, ascending by device (one all-gather).
std::vector<LoopEnd::StageDevice> stage_devices(Communicator& world, const DevicePipeline* pipeline,
                                                const PipelineStepStats& most) {
  constexpr std::size_t kFields = 4;
  const std::vector<std::int64_t> all =
      gather_records(world, {pipeline ? world.device() : -1, pipeline ? pipeline->stage : -1,
                             most.peak_sets, most.peak_set_bytes});
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<LoopEnd::StageDevice> out;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t* f = &all[r * kFields];
    if (f[0] < 0) continue;
    out.push_back({.device = static_cast<DeviceId>(f[0]),
                   .stage = static_cast<int>(f[1]),
                   .peak_sets = static_cast<int>(f[2]),
                   .peak_set_bytes = f[3]});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.device < b.device; });
  return out;
}

// What one launch does on every device.
struct Session {
  const PreparedModel* prepared = nullptr;  // null when preparing failed (the launch then fails)
  const ModelRunOptions* options = nullptr;
  const StepLoop* loop = nullptr;
  std::optional<SourceShare> share;  // the threads backend's: replicas draw their weights once
  std::mutex mu;
  fs::path staged;  // the leader's, for cleanup
  LoopEnd end;      // the same on every device

  void run(Communicator& world) {
    const DeviceId me = world.device();
    const TaskGraph& g = prepared->tasks;
    const Pcg& pcg = prepared->pcg;
    const DeviceTasks* mine = nullptr;
    const DevicePipeline* pipeline = nullptr;
    for (std::size_t i = 0; i < g.devices.size(); ++i) {
      if (g.devices[i].device != me) continue;
      mine = &g.devices[i];
      if (!prepared->pipelines.empty() && prepared->pipelines[i].stage >= 0)
        pipeline = &prepared->pipelines[i];
    }
    PipelineStepStats most;  // the peaks over the steps
    std::vector<Tensor> values = mine ? load_sources(pcg, *mine, share ? &*share : nullptr)
                                      : std::vector<Tensor>(pcg.nodes.size());
    if (loop->after_load) loop->after_load(world, values);
    std::vector<std::vector<Tensor>> micro_inputs;
    if (mine && prepared->micro_batches > 1) micro_inputs = load_micro_batches(pcg, *mine);
    const bool leader = me == prepared->leader;
    std::string path;
    if (options->save && leader) {
      path = stage_folder_of_folders(*options->save).string();
      std::lock_guard lock(mu);
      staged = path;
    }
    if (options->save) path = broadcast_string(world, path, rank_of(world, prepared->leader));
    std::vector<TraceEvent> events;
    LoopEnd ended;
    // The device's threads, kept across its steps.
    ThreadTeam team(options->threads_per_device > 0 ? options->threads_per_device
                                                    : default_threads_per_device(world.size()));
    const UseTeam use_team(&team);
    const std::vector<MemoryKind> kinds = memory_kinds(pcg);
    MemoryCounter memory(&kinds);
    for (int step = loop->first_step; step < loop->first_step + loop->steps; ++step) {
      TaskTimes times;
      const double start = steady_seconds();
      double waited = 0;
      // An error met in a step (bad input such as a token id outside the embedding's table, or
      // the device's failure) names the step and the device that met it.
      try {
        if (loop->feed) {
          loop->feed(step, world, values, micro_inputs);
          waited = steady_seconds() - start;
        }
        if (mine) {
          TaskRunOptions o = loop->options ? loop->options(step) : TaskRunOptions{};
          o.step = step;
          if (loop->held_beside) o.beside[MemoryKind::kSnapshot] = loop->held_beside(me);
          o.trace = options->trace ? &events : nullptr;
          o.times = &times;
          o.memory = &memory;
          if (pipeline) {
            PipelineStepStats stats;
            run_pipeline_step(g, *pipeline, world, values, micro_inputs, prepared->micro_batches, o,
                              &stats);
            most.peak_sets = std::max(most.peak_sets, stats.peak_sets);
            most.peak_set_bytes = std::max(most.peak_set_bytes, stats.peak_set_bytes);
            most.window_s = stats.window_s;
            most.busy_s = stats.busy_s;
          } else {
            run_step(g, *mine, world, values, micro_inputs, prepared->micro_batches, o);
          }
        }
      } catch (const Error& e) {
        // Bad input (exit 1) and a device's failure (exit 3) alike name the step; a peer's
        // collective that failed because of another device names that device already.
        if (e.scope() != ErrorScope::kThisDevice) throw;
        // Under mpi the launch names the device of a failing process itself.
        const std::string device =
            options->backend == Backend::kMpi ? "" : fmt::format("device {}: ", me);
        throw Error(e.kind(), fmt::format("{}step {}: {}", device, step, e.what()), e.scope());
      }
      if (prepared->stages) {
        // The step's bubble: the mean idle fraction over the stages' devices.
        std::array<double, 2> idle{0, 0};
        if (pipeline && most.window_s > 0)
          idle = {std::max(0.0, most.window_s - most.busy_s) / most.window_s, 1.0};
        all_reduce(world, {.send = reinterpret_cast<const std::byte*>(idle.data()),
                           .recv = reinterpret_cast<std::byte*>(idle.data()),
                           .count = 2,
                           .dtype = DType::kFloat64,
                           .op = ReduceOp::kSum});
        if (idle[1] > 0) times.bubble = idle[0] / idle[1];
      }
      // Every device's flag and data wait, reduced by max: also the step's end on every device.
      // The squared gradient norm rides along from the devices that hold it (-1 elsewhere).
      double norm_sq = -1;
      if (prepared->grad_norm && mine) {
        const Tensor& t = values[static_cast<std::size_t>(*prepared->grad_norm)];
        if (t.numel() == 1) {
          norm_sq = scalar_of(t);
          if (!std::isfinite(norm_sq)) norm_sq = INFINITY;
        }
      }
      std::array<double, 3> flag_wait{
          static_cast<double>(loop->stop_flag ? loop->stop_flag(values, leader) : 0), waited,
          norm_sq};
      all_reduce(world, {.send = reinterpret_cast<const std::byte*>(flag_wait.data()),
                         .recv = reinterpret_cast<std::byte*>(flag_wait.data()),
                         .count = 3,
                         .dtype = DType::kFloat64,
                         .op = ReduceOp::kMax});
      const auto flag = static_cast<std::int32_t>(flag_wait[0]);
      if (loop->feed) times.data_wait_s = flag_wait[1];
      if (flag_wait[2] >= 0) times.grad_norm = std::sqrt(flag_wait[2]);
      const double seconds = steady_seconds() - start;
      ended = {.step = step, .stop_flag = flag};
      // A step that ran to its end is followed by after_step (a checkpoint), then reported.
      if (flag == 0 && loop->after_step) loop->after_step(step, world, values);
      if (leader && loop->on_step) loop->on_step(step, seconds, times, values);
      if (flag != 0) break;
      if (loop->eval_at && loop->eval_at(step)) evaluate(step, world, mine, values, micro_inputs);
    }
    ended.measured = highest_peak(world, memory.result());
    if (prepared->stages) ended.pipeline = stage_devices(world, pipeline, most);
    {
      // Every device reduced the same flags: under mpi each process learns how the loop ended.
      std::lock_guard lock(mu);
      end = ended;
    }
    if (ended.stop_flag != 0) return;  // nothing is written; the staged folder is discarded
    if (options->save) save(world, fs::path(path), values);
    if (options->trace) {
      std::vector<TraceEvent> all = gather_events(world, events);
      if (leader) write_file_atomic(*options->trace, trace_json(g, all));
    }
  }

  // Runs the loop's evaluation after `step` on this device; the leader reports the mean loss.
  void evaluate(int step, Communicator& world, const DeviceTasks* mine, std::vector<Tensor>& values,
                std::vector<std::vector<Tensor>>& micro_inputs) {
    const bool leader = world.device() == prepared->leader;
    double total = 0;
    for (int b = 0; b < loop->eval_batches; ++b) {
      if (loop->eval_feed) loop->eval_feed(b, world, values, micro_inputs);
      if (!mine) continue;
      run_forward(prepared->tasks, *mine, world, values, micro_inputs, prepared->micro_batches,
                  {.step = step});
      if (leader) total += scalar_of(values[static_cast<std::size_t>(*prepared->loss)]);
      // What the forward tasks made is dropped: the next step makes it again.
      for (const Task& t : mine->tasks)
        if (t.phase == Phase::kForward) values[static_cast<std::size_t>(t.out)] = Tensor();
    }
    if (leader && loop->on_eval && loop->eval_batches > 0)
      loop->on_eval(step, total / loop->eval_batches);
  }

  void save(Communicator& world, const fs::path& dir, const std::vector<Tensor>& values) {
    const DeviceId me = world.device();
    const bool leader = me == prepared->leader;
    PlanCache plans(options->plan);
    for (std::size_t i = 0; i < prepared->saved.size(); ++i) {
      const ValueId v = prepared->saved[i];
      const Node& n = prepared->pcg.nodes[static_cast<std::size_t>(v)];
      const Layout& as = prepared->saved_as[i];
      const std::string name = n.name;
      const fs::path folder = dir / name;
      if (leader) {
        fs::create_directories(folder);
        write_file_atomic(folder / "layout.json", layout_to_json(as).dump(2) + "\n");
      }
      // A weight ZeRO-3 holds sharded goes back to the model's layout first.
      Tensor moved;
      const Tensor* shard = &values[static_cast<std::size_t>(v)];
      if (as != *n.layout) {
        for (const auto& [d, program] : plans.programs(*n.layout, as)) {
          if (d != me) continue;
          Tensor none(program->dtype, Shape{0});
          moved = execute(*program, world, program->in_from ? *shard : none);
        }
        shard = &moved;
      }
      barrier(world);
      if (auto index = find_device(as.mesh, me))
        write_npy(folder / shard_file_name(*index), *shard);
    }
    barrier(world);
    if (leader) {
      publish(dir, output_target(*options->save));
      std::lock_guard lock(mu);
      staged.clear();
    }
  }
};

}  // namespace

ValueId add_fetch(Pcg& pcg, ValueId value, DeviceId leader) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(value)];
  Node f{.name = "fetch:" + n.name,
         .kind = NodeKind::kMove,
         .phase = n.phase,
         .inputs = {value},
         .spec = n.spec};
  f.mesh = make_mesh({1}, {leader});
  f.placements = std::vector<Placement>{Placement::replicate()};
  f.layout = make_layout(*f.mesh, *f.placements, n.spec.shape, n.spec.dtype);
  f.moved_value = n.name;
  f.consumer = "the report";
  pcg.nodes.push_back(std::move(f));
  return static_cast<ValueId>(pcg.nodes.size() - 1);
}

int default_threads_per_device(int devices) {
  return std::max(1, available_cores() / std::max(1, devices));
}

PreparedModel prepare_model(const Model& model, Mode mode, const ModelRunOptions& options,
                            const TrainingCompile& training) {
  PreparedModel p;
  p.micro_batches = mode == Mode::kTrain ? training.micro_batches : 1;
  p.pcg = compile(model.pcg, mode,
                  {.plan = options.plan,
                   .overlap = options.overlap,
                   .decompose = {.shared_memory = options.backend == Backend::kThreads,
                                 .gather_form = options.gather_form,
                                 .always = options.overlap_always},
                   .update = training.update,
                   .micro_batches = p.micro_batches,
                   .zero = mode == Mode::kTrain ? training.zero : 0,
                   .recompute = training.recompute});
  const std::vector<DeviceId> used = pcg_devices(p.pcg);
  p.leader = options.backend == Backend::kMpi ? DeviceId{0} : used.front();
  std::vector<ValueId> keep;  // fetched values stay until the step ends
  auto fetch = [&](ValueId v) { return keep.emplace_back(add_fetch(p.pcg, v, p.leader)); };
  if (mode == Mode::kTrain) {
    p.loss = fetch(*p.pcg.loss);
    keep.push_back(*p.pcg.loss);
    p.grad_norm = find_grad_norm(p.pcg);
    if (p.grad_norm) keep.push_back(*p.grad_norm);
    for (const Node& n : model.pcg.nodes) {
      if (n.kind != NodeKind::kWeight) continue;
      p.saved.push_back(find_value(p.pcg, n.name));
      p.saved_as.push_back(make_layout(*n.mesh, *n.placements, n.spec.shape, n.spec.dtype));
      if (!training.fetch_training_values) continue;
      auto g = p.pcg.names.find("grad:" + n.name);
      if (g != p.pcg.names.end()) p.grads.emplace_back(n.name, fetch(g->second));
      p.weights.emplace_back(n.name, fetch(find_value(p.pcg, n.name)));
    }
  } else {
    for (ValueId v : p.pcg.outputs) {
      p.saved.push_back(v);
      p.saved_as.push_back(*p.pcg.nodes[static_cast<std::size_t>(v)].layout);
      keep.push_back(v);
      const Node& n = p.pcg.nodes[static_cast<std::size_t>(v)];
      if (!n.spec.shape.empty()) continue;
      std::string name = n.name;  // a copy: fetch appends to the nodes n lives in
      p.scalars.emplace_back(std::move(name), fetch(v));
    }
  }
  p.tasks = expand_shards(p.pcg, keep, options.plan);
  if (mode == Mode::kTrain && training.schedule) {
    p.stages = find_stages(p.tasks);
    if (p.stages) {
      const auto stages = static_cast<int>(p.stages->meshes.size());
      p.schedule = training.schedule(stages, p.micro_batches);
      MESHFLOW_CHECK(p.schedule.size() == static_cast<std::size_t>(stages));
      p.pipelines =
          device_pipelines(p.tasks, *p.stages, p.schedule, training.split_weights, p.micro_batches);
      // Stages that would wait on each other in a cycle run one after another, as without a
      // schedule; explain says why.
      p.not_pipelined = pipeline_conflict(p.tasks, *p.stages, p.pipelines);
      if (p.not_pipelined) {
        p.stages.reset();
        p.schedule.clear();
        p.pipelines.clear();
      }
    }
  }
  return p;
}

std::optional<PreparedModel> try_prepare(const Model& model, Mode mode,
                                         const ModelRunOptions& options, std::string& error,
                                         const TrainingCompile& training) {
  try {
    return prepare_model(model, mode, options, training);
  } catch (const Error& e) {
    if (options.backend != Backend::kMpi) throw;
    error = e.what();
    return std::nullopt;
  }
}

LoopEnd run_loop(const PreparedModel* prepared, const std::string& error,
                 const ModelRunOptions& options, const StepLoop& loop) {
  Session s{.prepared = prepared, .options = &options, .loop = &loop};
  LaunchOptions lo{.backend = options.backend, .timeout = options.timeout};
  if (prepared) {
    // Under mpi, listing the devices makes a world too small for them one clear error.
    for (const DeviceTasks& dt : prepared->tasks.devices) lo.devices.push_back(dt.device);
    // On threads every device loads in this process (under mpi each rank is one device).
    if (options.backend == Backend::kThreads)
      s.share.emplace(prepared->pcg, prepared->tasks, lo.devices);
    if (std::find(lo.devices.begin(), lo.devices.end(), prepared->leader) == lo.devices.end())
      lo.devices.insert(lo.devices.begin(), prepared->leader);
    lo.agreement = {{"the model", to_text(prepared->pcg)}};
  } else {
    lo.agreement = {{"preparation", "error: " + error}};
  }
  try {
    launch(lo, [&](Communicator& world) { s.run(world); });
  } catch (...) {
    if (!s.staged.empty()) discard(s.staged);
    throw;
  }
  if (!s.staged.empty()) discard(s.staged);  // the loop stopped: nothing is published
  MESHFLOW_CHECK(prepared != nullptr, "the launch ran without a prepared model");
  return s.end;
}

bool reports(const ModelRunOptions& options) {
  return options.backend != Backend::kMpi || prints_shared_errors();
}

double scalar_of(const Tensor& t) {
  double v = 0;
  visit_dtype(t.dtype(), [&](auto zero) { v = static_cast<double>(t.data<decltype(zero)>()[0]); });
  return v;
}

RunReport run_model(const Model& model, const ModelRunOptions& options,
                    const std::function<StepLoop::Feed(const PreparedModel&)>& feed_of) {
  std::string error;
  std::optional<PreparedModel> p = try_prepare(model, Mode::kRun, options, error);
  RunReport report;
  StepLoop loop;
  if (p && feed_of) loop.feed = feed_of(*p);
  if (p) {
    loop.on_step = [&](int, double, const TaskTimes&, const std::vector<Tensor>& values) {
      for (const auto& [name, v] : p->scalars)
        report.scalars.emplace_back(name, scalar_of(values[static_cast<std::size_t>(v)]));
    };
  }
  run_loop(p ? &*p : nullptr, error, options, loop);
  for (ValueId v : p->pcg.outputs) {
    const Node& n = p->pcg.nodes[static_cast<std::size_t>(v)];
    report.outputs.emplace_back(n.name, *n.layout);
  }
  report.reporter = reports(options);
  return report;
}

std::map<DeviceId, CallLog> record_calls(const Pcg& pcg) {
  const TaskGraph tasks = expand_shards(pcg, {});
  std::mutex mu;
  std::map<DeviceId, CallLog> logs;
  launch({.devices = first_devices(static_cast<int>(tasks.devices.size()))},
         [&](Communicator& comm) {
           auto log = std::make_shared<CallLog>();
           RecordingCommunicator recording(comm.devices(), comm.device(), log,
                                           comm.group(comm.devices()));
           const DeviceTasks& mine = tasks.devices[static_cast<std::size_t>(comm.device())];
           std::vector<Tensor> values = load_sources(pcg, mine);
           std::vector<std::vector<Tensor>> micro_inputs = load_micro_batches(pcg, mine);
           int micro_batches = 1;
           for (const Node& n : pcg.nodes) micro_batches = std::max(micro_batches, n.micro_batches);
           run_step(tasks, mine, recording, values, micro_inputs, micro_batches, {});
           std::lock_guard lock(mu);
           logs[comm.device()] = std::move(*log);
         });
  return logs;
}

}  // namespace meshflow
