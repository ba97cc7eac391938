// Order of work on every device: agree on what to run (under mpi, before any collective), load
// the device's source shards, stage the save folder (the leader), run the task graph (once per
// step, then a barrier so a step's time is every device's), write its saved shards, gather the
// trace, and publish (the leader). The leader is device 0 under mpi (world rank 0 prints) and
// the lowest device of the meshes under threads; the values it reports reach it by fetch moves
// appended to the graph (to a one-device mesh of the leader, Replicate).
#include "meshflow/runtime/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "meshflow/core/clock.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/reference.h"
#include "meshflow/graph/source.h"
#include "meshflow/mesh/sharded_folder.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

struct Prepared {
  Pcg pcg;  // compiled, fetches appended
  TaskGraph tasks;
  DeviceId leader = 0;
  std::optional<ValueId> loss;                                           // fetched loss
  std::vector<std::pair<std::string, ValueId>> grads, weights, scalars;  // fetched
  std::vector<ValueId> saved;                                            // values written by --save
};

// Appends a move of `value` to a one-device mesh of `leader`, all Replicate; returns its id.
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

Prepared prepare(const Model& model, Mode mode, bool check, const ModelRunOptions& options) {
  Prepared p;
  p.pcg = compile(model.pcg, mode,
                  {.plan = options.plan,
                   .overlap = options.overlap,
                   .decompose = {.shared_memory = options.backend == Backend::kThreads,
                                 .gather_form = options.gather_form,
                                 .always = options.overlap_always}});
  const std::vector<DeviceId> used = pcg_devices(p.pcg);
  p.leader = options.backend == Backend::kMpi ? DeviceId{0} : used.front();
  std::vector<ValueId> keep;  // fetched values stay until the step ends
  auto fetch = [&](ValueId v) { return keep.emplace_back(add_fetch(p.pcg, v, p.leader)); };
  if (mode == Mode::kTrain) {
    p.loss = fetch(*p.pcg.loss);
    keep.push_back(*p.pcg.loss);
    for (const Node& n : model.pcg.nodes) {
      if (n.kind != NodeKind::kWeight) continue;
      p.saved.push_back(find_value(p.pcg, n.name));
      if (!check) continue;
      auto g = p.pcg.names.find("grad:" + n.name);
      if (g != p.pcg.names.end()) p.grads.emplace_back(n.name, fetch(g->second));
      p.weights.emplace_back(n.name, fetch(find_value(p.pcg, n.name)));
    }
  } else {
    for (ValueId v : p.pcg.outputs) {
      p.saved.push_back(v);
      keep.push_back(v);
      const Node& n = p.pcg.nodes[static_cast<std::size_t>(v)];
      if (!n.spec.shape.empty()) continue;
      std::string name = n.name;  // a copy: fetch appends to the nodes n lives in
      p.scalars.emplace_back(std::move(name), fetch(v));
    }
  }
  p.tasks = expand_shards(p.pcg, keep, options.plan);
  return p;
}

double scalar_of(const Tensor& t) {
  double v = 0;
  visit_dtype(t.dtype(), [&](auto zero) { v = static_cast<double>(t.data<decltype(zero)>()[0]); });
  return v;
}

// Returns every device's trace events on every device (one all-gather of counts, one of data).
std::vector<TraceEvent> gather_events(Communicator& world, const std::vector<TraceEvent>& mine) {
  constexpr std::size_t kFields = 8;
  std::vector<double> packed;
  for (const TraceEvent& e : mine) {
    packed.insert(packed.end(),
                  {static_cast<double>(e.device), static_cast<double>(e.value),
                   static_cast<double>(e.kind), static_cast<double>(e.phase),
                   static_cast<double>(e.step), static_cast<double>(e.block), e.start_s, e.end_s});
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
                             .end_s = all[i + 7]});
  }
  return out;
}

// What one launch does on every device; `on_step` runs on the leader after each step.
struct Session {
  const Prepared* prepared = nullptr;  // null when preparing failed (the launch then fails)
  const ModelRunOptions* options = nullptr;
  int steps = 1;
  double lr = 0.1;
  std::function<void(int step, double seconds, const TaskTimes& times,
                     const std::vector<Tensor>& values)>
      on_step;
  std::mutex mu;
  fs::path staged;  // the leader's, for cleanup

  void run(Communicator& world) {
    const DeviceId me = world.device();
    const TaskGraph& g = prepared->tasks;
    const Pcg& pcg = prepared->pcg;
    const DeviceTasks* mine = nullptr;
    for (const DeviceTasks& dt : g.devices)
      if (dt.device == me) mine = &dt;
    std::vector<Tensor> values =
        mine ? load_sources(pcg, *mine) : std::vector<Tensor>(pcg.nodes.size());
    const bool leader = me == prepared->leader;
    std::string path;
    if (options->save && leader) {
      path = stage_folder_of_folders(*options->save).string();
      std::lock_guard lock(mu);
      staged = path;
    }
    if (options->save) path = broadcast_string(world, path, rank_of(world, prepared->leader));
    std::vector<TraceEvent> events;
    for (int step = 1; step <= steps; ++step) {
      TaskTimes times;
      const double start = steady_seconds();
      if (mine) {
        run_tasks(
            g, *mine, world, values,
            {.lr = lr, .step = step, .trace = options->trace ? &events : nullptr, .times = &times});
      }
      barrier(world);
      const double seconds = steady_seconds() - start;
      if (leader && on_step) on_step(step, seconds, times, values);
    }
    if (options->save) save(world, fs::path(path), values);
    if (options->trace) {
      std::vector<TraceEvent> all = gather_events(world, events);
      if (leader) write_file_atomic(*options->trace, trace_json(g, all));
    }
  }

  void save(Communicator& world, const fs::path& dir, const std::vector<Tensor>& values) {
    const DeviceId me = world.device();
    const bool leader = me == prepared->leader;
    for (ValueId v : prepared->saved) {
      const Node& n = prepared->pcg.nodes[static_cast<std::size_t>(v)];
      const std::string name = n.name;
      const fs::path folder = dir / name;
      if (leader) {
        fs::create_directories(folder);
        write_file_atomic(folder / "layout.json", layout_to_json(*n.layout).dump(2) + "\n");
      }
      barrier(world);
      if (auto index = find_device(n.layout->mesh, me))
        write_npy(folder / shard_file_name(*index), values[static_cast<std::size_t>(v)]);
    }
    barrier(world);
    if (leader) publish(dir, output_target(*options->save));
  }
};

// Launches `session` on every device of the task graph (and the leader).
void launch_session(Session& s, const Prepared* prepared, const std::string& error,
                    const ModelRunOptions& options, const std::string& what) {
  LaunchOptions lo{.backend = options.backend, .timeout = options.timeout};
  if (prepared) {
    // Under mpi, listing the devices makes a world too small for them one clear error.
    for (const DeviceTasks& dt : prepared->tasks.devices) lo.devices.push_back(dt.device);
    if (std::find(lo.devices.begin(), lo.devices.end(), prepared->leader) == lo.devices.end())
      lo.devices.insert(lo.devices.begin(), prepared->leader);
    lo.agreement = {{"the model", what}};
  } else {
    lo.agreement = {{"preparation", "error: " + error}};
  }
  try {
    launch(lo, [&](Communicator& world) { s.run(world); });
  } catch (...) {
    if (!s.staged.empty()) discard(s.staged);
    throw;
  }
}

// Under mpi a rank's failure to prepare must reach every rank (or they would wait for it), so
// it travels in the launch's agreement; under threads it is thrown at once.
std::optional<Prepared> try_prepare(const Model& model, Mode mode, bool check,
                                    const ModelRunOptions& options, std::string& error) {
  try {
    return prepare(model, mode, check, options);
  } catch (const Error& e) {
    if (options.backend != Backend::kMpi) throw;
    error = e.what();
    return std::nullopt;
  }
}

bool reports(const ModelRunOptions& options) {
  return options.backend != Backend::kMpi || prints_shared_errors();
}

}  // namespace

RunReport run_model(const Model& model, const ModelRunOptions& options) {
  std::string error;
  std::optional<Prepared> p = try_prepare(model, Mode::kRun, false, options, error);
  RunReport report;
  Session s{.prepared = p ? &*p : nullptr, .options = &options};
  if (p) {
    s.on_step = [&](int, double, const TaskTimes&, const std::vector<Tensor>& values) {
      for (const auto& [name, v] : p->scalars)
        report.scalars.emplace_back(name, scalar_of(values[static_cast<std::size_t>(v)]));
    };
  }
  launch_session(s, p ? &*p : nullptr, error, options, p ? to_text(p->pcg) : "");
  MESHFLOW_CHECK(p.has_value(), "the launch ran without a prepared model");
  for (ValueId v : p->pcg.outputs) {
    const Node& n = p->pcg.nodes[static_cast<std::size_t>(v)];
    report.outputs.emplace_back(n.name, *n.layout);
  }
  report.reporter = reports(options);
  return report;
}

TrainReport train_model(const Model& model, const TrainOptions& options) {
  std::string error;
  std::optional<Prepared> p = try_prepare(model, Mode::kTrain, options.check, options.run, error);
  TrainReport report;
  // Per step, the fetched gradients and weights (check only).
  std::vector<std::vector<Tensor>> grads, weights;
  Session s{.prepared = p ? &*p : nullptr,
            .options = &options.run,
            .steps = options.steps,
            .lr = options.lr};
  if (p) {
    s.on_step = [&](int step, double seconds, const TaskTimes& times,
                    const std::vector<Tensor>& values) {
      auto value = [&](ValueId v) -> const Tensor& { return values[static_cast<std::size_t>(v)]; };
      StepReport r{
          .step = step, .loss = scalar_of(value(*p->loss)), .seconds = seconds, .times = times};
      report.steps.push_back(r);
      if (options.check) {
        grads.emplace_back();
        weights.emplace_back();
        for (const auto& [name, v] : p->grads) grads.back().push_back(value(v).clone());
        for (const auto& [name, v] : p->weights) weights.back().push_back(value(v).clone());
      }
      if (options.progress) options.progress(r);
    };
  }
  launch_session(s, p ? &*p : nullptr, error, options.run, p ? to_text(p->pcg) : "");
  MESHFLOW_CHECK(p.has_value(), "the launch ran without a prepared model");
  report.reporter = reports(options.run);
  if (options.check && report.reporter) {
    CheckReport c;
    ReferenceModel ref = reference_load(model.pcg);
    for (int step = 0; step < options.steps; ++step) {
      reference_forward(ref);
      const double loss = scalar_of(ref.values[static_cast<std::size_t>(*model.pcg.loss)]);
      c.max_loss_diff = std::max(
          c.max_loss_diff, std::abs(loss - report.steps[static_cast<std::size_t>(step)].loss));
      std::map<std::string, Tensor> g = reference_gradients(ref);
      for (std::size_t i = 0; i < p->grads.size(); ++i) {
        c.max_grad_diff = std::max(
            c.max_grad_diff,
            max_abs_difference(grads[static_cast<std::size_t>(step)][i], g.at(p->grads[i].first)));
      }
      reference_update(ref, g, options.lr);
      for (std::size_t i = 0; i < p->weights.size(); ++i) {
        const Tensor& w =
            ref.values[static_cast<std::size_t>(find_value(model.pcg, p->weights[i].first))];
        c.max_weight_diff = std::max(
            c.max_weight_diff, max_abs_difference(weights[static_cast<std::size_t>(step)][i], w));
      }
    }
    report.check = c;
  }
  return report;
}

nlohmann::json to_json(const TrainReport& report) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepReport& s : report.steps)
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}});
  nlohmann::json check = nullptr;
  if (report.check) {
    check = {{"max_loss_diff", report.check->max_loss_diff},
             {"max_weight_diff", report.check->max_weight_diff},
             {"max_grad_diff", report.check->max_grad_diff}};
  }
  return {{"steps", steps}, {"check", check}};
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
           run_tasks(tasks, mine, recording, values, {});
           std::lock_guard lock(mu);
           logs[comm.device()] = std::move(*log);
         });
  return logs;
}

}  // namespace meshflow
