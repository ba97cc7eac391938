// Stages, their task groups and the pipelined step.
#include "meshflow/runtime/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/float_mode.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

std::string to_string(const ScheduledGroup& g) {
  const char kind = g.kind == GroupKind::kForward    ? 'F'
                    : g.kind == GroupKind::kBackward ? 'B'
                                                     : 'W';
  return fmt::format("{}{}", kind, g.micro_batch);
}

namespace {

bool per_micro_batch(const Task& t) { return !t.once_per_step; }

const DeviceMesh& mesh_of(const TaskGraph& g, ValueId v) {
  return g.layouts[static_cast<std::size_t>(v)].mesh;
}

// Returns the stage all of `mesh`'s devices are in, or -1 when they are not in one stage.
int stage_of_mesh(const PipelineStages& s, const DeviceMesh& mesh) {
  int stage = -1;
  for (DeviceId d : mesh.devices) {
    auto it = s.stage_of.find(d);
    if (it == s.stage_of.end() || (stage >= 0 && it->second != stage)) return -1;
    stage = it->second;
  }
  return stage;
}

// The source and destination stages of a per-micro-batch move that crosses stages.
std::optional<std::pair<int, int>> crossing(const TaskGraph& g, const PipelineStages& s,
                                            const Task& t) {
  const auto* m = std::get_if<MoveTask>(&t.work);
  if (!m) return std::nullopt;
  const int from = stage_of_mesh(s, mesh_of(g, m->input));
  const int to = stage_of_mesh(s, mesh_of(g, t.out));
  if (from < 0 || to < 0 || from == to) return std::nullopt;
  return std::pair{from, to};
}

}  // namespace

std::optional<PipelineStages> find_stages(const TaskGraph& graph) {
  // The device sets of per-micro-batch forward kernels, each with the first value computed on
  // it, then in that order.
  std::map<std::vector<DeviceId>, ValueId> first_value;
  for (const DeviceTasks& dt : graph.devices) {
    for (const Task& t : dt.tasks) {
      if (!per_micro_batch(t) || t.phase != Phase::kForward) continue;
      if (!std::holds_alternative<ComputeTask>(t.work) &&
          !std::holds_alternative<OverlapTask>(t.work))
        continue;
      std::vector<DeviceId> devices = mesh_of(graph, t.out).devices;
      std::sort(devices.begin(), devices.end());
      auto [it, added] = first_value.emplace(std::move(devices), t.out);
      if (!added) it->second = std::min(it->second, t.out);
    }
  }
  std::map<ValueId, std::vector<DeviceId>> first_use;
  for (const auto& [devices, v] : first_value) first_use.emplace(v, devices);
  // Overlapping meshes are one stage.
  PipelineStages stages;
  std::vector<std::vector<DeviceId>> groups;
  for (const auto& [v, devices] : first_use) {
    std::optional<std::size_t> joined;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      for (DeviceId d : devices) {
        if (std::find(groups[i].begin(), groups[i].end(), d) == groups[i].end()) continue;
        if (joined && *joined != i) return std::nullopt;  // bridges two stages
        joined = i;
      }
    }
    if (!joined) {
      groups.push_back(devices);
      continue;
    }
    for (DeviceId d : devices)
      if (std::find(groups[*joined].begin(), groups[*joined].end(), d) == groups[*joined].end())
        groups[*joined].push_back(d);
  }
  if (groups.size() < 2) return std::nullopt;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    std::sort(groups[i].begin(), groups[i].end());
    for (DeviceId d : groups[i]) stages.stage_of[d] = static_cast<int>(i);
    stages.meshes.push_back(make_mesh({static_cast<std::int64_t>(groups[i].size())}, groups[i]));
  }
  // Every per-micro-batch task stays on its device's stage or moves between two stages.
  for (const DeviceTasks& dt : graph.devices) {
    for (const Task& t : dt.tasks) {
      if (!per_micro_batch(t)) continue;
      if (!stages.stage_of.contains(dt.device)) return std::nullopt;
      if (crossing(graph, stages, t)) {
        const auto& m = std::get<MoveTask>(t.work);
        if (m.program->steps.size() != 1 ||
            !std::holds_alternative<PointToPointCall>(m.program->steps[0].call))
          return std::nullopt;
        continue;
      }
      if (stage_of_mesh(stages, mesh_of(graph, t.out)) < 0) return std::nullopt;
      if (const auto* m = std::get_if<MoveTask>(&t.work))
        if (stage_of_mesh(stages, mesh_of(graph, m->input)) < 0) return std::nullopt;
    }
  }
  return stages;
}

namespace {

// What every device's pipeline derives from the whole graph, computed once: each crossing
// value's tag block, the values some per-micro-batch task reads, and per stage the values its
// B groups hold.
struct SharedFacts {
  std::map<ValueId, int> tag;
  std::set<ValueId> read_anywhere;
  std::map<int, std::set<ValueId>> upstream;
  std::map<int, std::set<ValueId>> weight;  // per stage, the values its W groups make
};

// Returns whether `values` holds the task's value or one it makes beside it (a fused kernel's).
bool holds_any(const std::set<ValueId>& values, const Task& t) {
  if (values.contains(t.out)) return true;
  const std::vector<ValueId> made = values_made(t);
  return std::any_of(made.begin(), made.end(), [&](ValueId v) { return values.contains(v); });
}

// Returns the values stage `stage`'s W groups make (zb), decided by value over its devices:
// the weights' gradients (what the micro-batches accumulate) and every value made from one
// (their reductions), then, back to a fixed point, the values only W tasks read that are made
// from values held until W anyway (sources, or values a W task reads too: a recomputed norm
// only a weight gradient reads). The rest of a backward (the input gradient, and on the first
// stage the chain that releases the received gradient) stays in B, so that a set waiting for
// its W holds only what W reads. Nothing B needs upstream is ever W.
std::set<ValueId> weight_values(const TaskGraph& graph, const PipelineStages& stages, int stage,
                                const std::set<ValueId>& upstream) {
  std::set<ValueId> weight;
  std::vector<const DeviceTasks*> devices;
  for (const DeviceTasks& dt : graph.devices) {
    auto at = stages.stage_of.find(dt.device);
    if (at != stages.stage_of.end() && at->second == stage) devices.push_back(&dt);
  }
  auto candidate = [&](const Task& t) {
    return per_micro_batch(t) && t.phase != Phase::kForward && !holds_any(upstream, t);
  };
  auto add = [&](const Task& t) {
    weight.insert(t.out);
    for (ValueId v : values_made(t)) weight.insert(v);
  };
  for (const DeviceTasks* dt : devices) {
    const std::set<ValueId> accumulated(dt->accumulated.begin(), dt->accumulated.end());
    for (const Task& t : dt->tasks) {
      if (!candidate(t)) continue;
      const std::vector<ValueId> reads = task_reads(t);
      if (holds_any(accumulated, t) ||
          std::any_of(reads.begin(), reads.end(), [&](ValueId v) { return weight.contains(v); }))
        add(t);
    }
  }
  for (std::size_t before = 0; before != weight.size();) {
    before = weight.size();
    for (const DeviceTasks* dt : devices) {
      // Per value, whether a W task reads it, and whether any other per-micro-batch task does.
      std::set<ValueId> read_by_w, read_by_other;
      for (const Task& t : dt->tasks) {
        if (!per_micro_batch(t)) continue;
        for (ValueId v : task_reads(t))
          (holds_any(weight, t) ? read_by_w : read_by_other).insert(v);
      }
      const std::set<ValueId> sources(dt->sources.begin(), dt->sources.end());
      for (std::size_t i = dt->tasks.size(); i-- > 0;) {
        const Task& t = dt->tasks[i];
        if (!candidate(t) || holds_any(weight, t)) continue;
        std::vector<ValueId> made = values_made(t);
        made.push_back(t.out);
        const bool only_w = std::all_of(made.begin(), made.end(), [&](ValueId v) {
          return read_by_w.contains(v) && !read_by_other.contains(v);
        });
        const std::vector<ValueId> reads = task_reads(t);
        const bool held = std::all_of(reads.begin(), reads.end(), [&](ValueId v) {
          return sources.contains(v) || read_by_w.contains(v);
        });
        if (only_w && held) add(t);
      }
    }
  }
  return weight;
}

SharedFacts shared_facts(const TaskGraph& graph, const PipelineStages& stages, int micro_batches) {
  SharedFacts f;
  // Tags: one block of micro_batches per crossing value, numbered alike on every device.
  std::set<ValueId> crossing_values;
  for (const DeviceTasks& dt : graph.devices) {
    for (const Task& t : dt.tasks) {
      if (!per_micro_batch(t)) continue;
      if (crossing(graph, stages, t)) crossing_values.insert(t.out);
      // Values some per-micro-batch task reads (a move no such task reads only reports its
      // value).
      for (ValueId v : task_reads(t)) f.read_anywhere.insert(v);
    }
  }
  int k = 0;
  for (ValueId v : crossing_values) {
    MESHFLOW_CHECK(static_cast<std::int64_t>(k + 1) * micro_batches < (1 << 22),
                   "too many pipeline transfers to tag");
    f.tag[v] = k++ * micro_batches + 1;
  }
  // B holds what a gradient sent upstream needs, and the gradient's arrival from downstream:
  // decided by value over every device of the stage, so that they all split alike and their
  // collectives stay in one order.
  for (int stage = 0; stage < static_cast<int>(stages.meshes.size()); ++stage) {
    std::set<ValueId>& upstream = f.upstream[stage];
    for (std::size_t before = 1; before != upstream.size();) {  // to a fixed point
      before = upstream.size();
      for (const DeviceTasks& dt : graph.devices) {
        auto at = stages.stage_of.find(dt.device);
        if (at == stages.stage_of.end() || at->second != stage) continue;
        std::vector<bool> needed(dt.tasks.size(), false);
        for (std::size_t i = 0; i < dt.tasks.size(); ++i) {
          const Task& t = dt.tasks[i];
          if (!per_micro_batch(t)) continue;
          auto cross = crossing(graph, stages, t);
          needed[i] = (cross && cross->second < cross->first && f.read_anywhere.contains(t.out)) ||
                      holds_any(upstream, t);
        }
        for (std::size_t i = dt.tasks.size(); i-- > 0;)
          if (needed[i])
            for (int d : dt.tasks[i].deps) needed[static_cast<std::size_t>(d)] = true;
        for (std::size_t i = 0; i < dt.tasks.size(); ++i) {
          if (!needed[i]) continue;
          upstream.insert(dt.tasks[i].out);
          for (ValueId v : values_made(dt.tasks[i])) upstream.insert(v);
        }
      }
    }
    f.weight[stage] = weight_values(graph, stages, stage, upstream);
  }
  return f;
}

DevicePipeline device_pipeline(const TaskGraph& graph, const DeviceTasks& device,
                               const PipelineStages& stages, const SharedFacts& facts,
                               std::vector<ScheduledGroup> order, bool split_weights) {
  DevicePipeline p;
  p.stage = stages.stage_of.at(device.device);
  p.tasks = device;
  p.order = std::move(order);
  const std::vector<Task>& tasks = device.tasks;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    if (!per_micro_batch(t) || !crossing(graph, stages, t)) continue;
    const bool sends =
        find_device(mesh_of(graph, std::get<MoveTask>(t.work).input), device.device).has_value();
    p.cross[static_cast<int>(i)] = {.sends = sends, .tag = facts.tag.at(t.out)};
  }
  // A receive whose value no per-micro-batch task of this device reads (a fetch to the leader)
  // waits until the stage's own groups are done, so the stage never waits for it.
  std::set<ValueId> read;
  for (const Task& t : tasks)
    if (per_micro_batch(t))
      for (ValueId v : task_reads(t)) read.insert(v);
  // A send to a later stage of values only forward tasks make (an activation its weight
  // gradient reads in another layout) goes with the forward group: the later stage's backward
  // needs it before this stage's backward can start.
  std::vector<bool> in_forward(tasks.size(), false);
  auto sends_forward_values = [&](int idx) {
    const Task& t = tasks[static_cast<std::size_t>(idx)];
    auto c = p.cross.find(idx);
    auto cross = crossing(graph, stages, t);
    if (c == p.cross.end() || !c->second.sends || cross->second < cross->first) return false;
    return std::all_of(t.deps.begin(), t.deps.end(),
                       [&](int d) { return in_forward[static_cast<std::size_t>(d)]; });
  };
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    if (!per_micro_batch(t)) continue;
    const int idx = static_cast<int>(i);
    if (auto c = p.cross.find(idx);
        c != p.cross.end() && !c->second.sends && !read.contains(t.out) && t.deps.empty()) {
      p.deferred.push_back(idx);
    } else if (t.phase == Phase::kForward || sends_forward_values(idx)) {
      p.forward.push_back(idx);
      in_forward[i] = true;
    } else if (split_weights && holds_any(facts.weight.at(p.stage), t)) {
      p.weight.push_back(idx);
    } else {
      p.backward.push_back(idx);
    }
  }
  // B never reads what W makes (W runs after it).
  std::set<ValueId> made_by_w;
  for (int k : p.weight)
    for (ValueId v : values_made(tasks[static_cast<std::size_t>(k)])) made_by_w.insert(v);
  for (int k : p.backward) {
    for (ValueId v : task_reads(tasks[static_cast<std::size_t>(k)]))
      MESHFLOW_CHECK(!made_by_w.contains(v), "a B task reads \"{}\", which W makes",
                     graph.names[static_cast<std::size_t>(v)]);
  }
  // Releases move to each value's last reader in group order (F, B, W); a reshape whose input
  // is read later no longer takes its buffer.
  std::vector<int> sequence = p.forward;
  sequence.insert(sequence.end(), p.backward.begin(), p.backward.end());
  sequence.insert(sequence.end(), p.weight.begin(), p.weight.end());
  std::map<ValueId, std::size_t> last_read;
  for (std::size_t k = 0; k < sequence.size(); ++k)
    for (ValueId v : task_reads(tasks[static_cast<std::size_t>(sequence[k])])) last_read[v] = k;
  std::vector<std::vector<ValueId>> release(sequence.size());
  for (std::size_t k = 0; k < sequence.size(); ++k) {
    Task& t = p.tasks.tasks[static_cast<std::size_t>(sequence[k])];
    for (ValueId v : t.release) {
      auto it = last_read.find(v);
      const std::size_t at = it == last_read.end() ? k : std::max(k, it->second);
      release[at].push_back(v);
      if (at != k && t.reuses_input) t.reuses_input = false;
    }
  }
  for (std::size_t k = 0; k < sequence.size(); ++k)
    p.tasks.tasks[static_cast<std::size_t>(sequence[k])].release = std::move(release[k]);
  return p;
}

}  // namespace

const std::vector<int>& group_tasks(const DevicePipeline& pipeline, GroupKind kind) {
  return kind == GroupKind::kForward    ? pipeline.forward
         : kind == GroupKind::kBackward ? pipeline.backward
                                        : pipeline.weight;
}

std::vector<DevicePipeline> device_pipelines(const TaskGraph& graph, const PipelineStages& stages,
                                             const std::vector<std::vector<ScheduledGroup>>& orders,
                                             bool split_weights, int micro_batches) {
  MESHFLOW_CHECK(orders.size() == stages.meshes.size());
  const SharedFacts facts = shared_facts(graph, stages, micro_batches);
  std::vector<DevicePipeline> out;
  for (const DeviceTasks& dt : graph.devices) {
    auto at = stages.stage_of.find(dt.device);
    if (at == stages.stage_of.end()) {  // once-per-step work only
      out.push_back(DevicePipeline{.stage = -1});
      continue;
    }
    out.push_back(device_pipeline(graph, dt, stages, facts,
                                  orders[static_cast<std::size_t>(at->second)], split_weights));
  }
  return out;
}

std::optional<std::string> pipeline_conflict(const TaskGraph& graph, const PipelineStages& stages,
                                             const std::vector<DevicePipeline>& pipelines) {
  // Per moved value, whether a receiver reads it (not deferred).
  std::set<ValueId> read;
  for (const DevicePipeline& p : pipelines)
    for (const auto& [k, move] : p.cross)
      if (!move.sends && std::find(p.deferred.begin(), p.deferred.end(), k) == p.deferred.end())
        read.insert(p.tasks.tasks[static_cast<std::size_t>(k)].out);
  for (const DevicePipeline& p : pipelines) {
    if (p.stage < 0) continue;
    auto in = [&](const std::vector<int>& group, int k) {
      return std::find(group.begin(), group.end(), k) != group.end();
    };
    for (const auto& [k, move] : p.cross) {
      const Task& t = p.tasks.tasks[static_cast<std::size_t>(k)];
      const auto [from, to] = *crossing(graph, stages, t);
      // To a later stage: sent by its forward group (F<i> precedes all of i downstream). To an
      // earlier one: received by a backward group or after the groups, and, where read, sent
      // by a forward or B group (B<i> precedes B<i> upstream; a W may come later).
      bool ok = true;
      if (to > from) {
        ok = !move.sends || in(p.forward, k);
      } else if (move.sends) {
        ok = !read.contains(t.out) || !in(p.weight, k);
      } else {
        ok = !in(p.forward, k);
      }
      if (!ok) {
        return fmt::format("\"{}\" moves from stage {} to stage {} in the {} pass",
                           graph.names[static_cast<std::size_t>(t.out)], from, to,
                           t.phase == Phase::kForward ? "forward" : "backward");
      }
    }
  }
  return std::nullopt;
}

std::int64_t activation_set_bytes(const TaskGraph& graph, const DevicePipeline& pipeline) {
  const std::vector<Task>& tasks = pipeline.tasks.tasks;
  std::set<ValueId> made, read;
  for (int k : pipeline.forward) {
    const Task& t = tasks[static_cast<std::size_t>(k)];
    for (ValueId v : values_made(t)) made.insert(v);
  }
  for (const std::vector<int>* group : {&pipeline.backward, &pipeline.weight})
    for (int k : *group)
      for (ValueId v : task_reads(tasks[static_cast<std::size_t>(k)])) read.insert(v);
  std::int64_t bytes = 0;
  for (ValueId v : made)
    if (read.contains(v)) bytes += shard_bytes(graph, v, pipeline.tasks.device);
  return bytes;
}

void run_pipeline_step(const TaskGraph& graph, const DevicePipeline& pipeline, Communicator& world,
                       std::vector<Tensor>& values, std::vector<std::vector<Tensor>>& micro_inputs,
                       int micro_batches, TaskRunOptions options, PipelineStepStats* stats) {
  const FlushDenormals flush;
  const DeviceTasks& dt = pipeline.tasks;
  const auto M = static_cast<std::size_t>(micro_batches);
  const MemoryBreakdown base = options.beside;  // the caller's (a checkpoint's snapshot)
  // The values a micro-batch keeps apart from the others: its inputs and what its tasks make.
  std::vector<bool> accumulated(values.size(), false);
  for (ValueId v : dt.accumulated) accumulated[static_cast<std::size_t>(v)] = true;
  std::vector<ValueId> own;
  for (std::size_t v = 0; v < micro_inputs.size(); ++v)
    if (!micro_inputs[v].empty()) own.push_back(static_cast<ValueId>(v));
  for (const Task& t : dt.tasks) {
    if (t.once_per_step) continue;
    for (ValueId v : values_made(t))
      if (!accumulated[static_cast<std::size_t>(v)]) own.push_back(v);
  }
  std::sort(own.begin(), own.end());
  own.erase(std::unique(own.begin(), own.end()), own.end());
  std::vector<std::vector<Tensor>> sets(M);
  for (std::size_t m = 0; m < M; ++m) {
    sets[m].resize(own.size());
    for (std::size_t i = 0; i < own.size(); ++i) {
      const auto v = static_cast<std::size_t>(own[i]);
      if (v < micro_inputs.size() && !micro_inputs[v].empty())
        sets[m][i] = std::move(micro_inputs[v][m]);
    }
  }
  for (ValueId v : own) {
    if (static_cast<std::size_t>(v) < micro_inputs.size() && !micro_inputs[v].empty())
      values[static_cast<std::size_t>(v)] = Tensor();
  }
  // Sums over micro-batches, in micro-batch order, as run_step makes them.
  const std::vector<bool> in_place = accumulated_in_place(dt);
  std::vector<Tensor> sums(dt.accumulated.size());
  std::vector<bool> summed(dt.accumulated.size(), false);
  std::map<ValueId, int> producer;  // accumulated value -> its per-micro-batch task
  for (std::size_t t = 0; t < dt.tasks.size(); ++t) {
    if (dt.tasks[t].once_per_step) continue;
    producer[dt.tasks[t].out] = static_cast<int>(t);
    for (ValueId v : values_made(dt.tasks[t])) producer[v] = static_cast<int>(t);
  }
  std::vector<std::size_t> last_group(M, 0);
  for (std::size_t k = 0; k < pipeline.order.size(); ++k)
    last_group[static_cast<std::size_t>(pipeline.order[k].micro_batch)] = k;
  const std::vector<MemoryKind>* kinds = options.memory ? &options.memory->kinds() : nullptr;
  // A set's activations: the forward values (and their recomputations) its tasks made and keep
  // (its inputs wait there from the start, uncounted). The gradients a set waiting for its W
  // holds count as gradients (measured_memory), not here.
  auto set_bytes = [&](std::size_t m) {
    std::int64_t b = 0;
    for (std::size_t i = 0; i < own.size(); ++i) {
      const auto v = static_cast<std::size_t>(own[i]);
      if (kinds && (*kinds)[v] != MemoryKind::kActivations) continue;
      if (v >= micro_inputs.size() || micro_inputs[v].empty())
        b += static_cast<std::int64_t>(sets[m][i].nbytes());
    }
    return b;
  };
  std::vector<PendingSend> sending;
  std::vector<bool> open(M, false);
  double first_start = -1, last_end = 0, busy = 0;
  TaskTimes* caller_times = options.times;
  // Runs `group` as micro-batch m's (its set swapped in, its sums kept), timing it into `times`.
  auto run_group = [&](const std::vector<int>& group, std::size_t m, TaskTimes& times) {
    for (std::size_t i = 0; i < own.size(); ++i)
      std::swap(values[static_cast<std::size_t>(own[i])], sets[m][i]);
    for (std::size_t i = 0; i < sums.size(); ++i)
      if (in_place[i] && summed[i])
        values[static_cast<std::size_t>(dt.accumulated[i])] = std::exchange(sums[i], Tensor());
    if (kinds) {
      MemoryBreakdown beside = base;
      for (std::size_t o = 0; o < M; ++o)
        for (std::size_t i = 0; i < own.size(); ++i)
          beside[(*kinds)[static_cast<std::size_t>(own[i])]] +=
              static_cast<std::int64_t>(sets[o][i].nbytes());
      for (std::size_t i = 0; i < sums.size(); ++i)
        beside[(*kinds)[static_cast<std::size_t>(dt.accumulated[i])]] +=
            static_cast<std::int64_t>(sums[i].nbytes());
      options.beside = beside;
    }
    options.times = &times;
    options.part = TaskPart::kMicroBatch;
    options.only = &group;
    options.tagged = &pipeline.cross;
    options.sending = &sending;
    options.micro_batch = static_cast<int>(m);
    options.accumulate = m > 0;
    run_tasks(graph, dt, world, values, options);
    if (caller_times) {
      caller_times->compute_s += times.compute_s;
      caller_times->move_s += times.move_s;
      caller_times->update_s += times.update_s;
    }
    // The sums this group made or added to.
    for (std::size_t i = 0; i < sums.size(); ++i) {
      const ValueId v = dt.accumulated[i];
      Tensor& made = values[static_cast<std::size_t>(v)];
      auto p = producer.find(v);
      const bool made_here =
          p != producer.end() && std::find(group.begin(), group.end(), p->second) != group.end();
      if (in_place[i] && summed[i] && !made_here) {
        sums[i] = std::exchange(made, Tensor());  // put back untouched
        continue;
      }
      if (!made_here) continue;
      if (!summed[i] || in_place[i]) {
        sums[i] = std::exchange(made, Tensor());
      } else {
        add_into(sums[i], made);
        made = Tensor();
      }
      summed[i] = true;
    }
    for (std::size_t i = 0; i < own.size(); ++i)
      std::swap(values[static_cast<std::size_t>(own[i])], sets[m][i]);
  };
  for (std::size_t k = 0; k < pipeline.order.size(); ++k) {
    const ScheduledGroup& g = pipeline.order[k];
    const auto m = static_cast<std::size_t>(g.micro_batch);
    const std::vector<int>& group = group_tasks(pipeline, g.kind);
    if (g.kind == GroupKind::kForward) open[m] = true;
    TaskTimes times;
    const double start = steady_seconds();
    run_group(group, m, times);
    const double end = steady_seconds();
    if (first_start < 0) first_start = start;
    last_end = end;
    busy += times.compute_s;
    if (options.trace) {
      options.trace->push_back(
          TraceEvent{.device = dt.device,
                     .kind = TraceKind::kGroup,
                     .phase = g.kind == GroupKind::kForward ? Phase::kForward : Phase::kBackward,
                     .step = options.step,
                     .start_s = start,
                     .end_s = end,
                     .group = to_string(g)[0],
                     .micro_batch = g.micro_batch});
    }
    if (stats) {
      int held = 0;
      std::int64_t bytes = 0;
      for (std::size_t o = 0; o < M; ++o) {
        held += open[o] ? 1 : 0;
        bytes += set_bytes(o);
      }
      stats->peak_sets = std::max(stats->peak_sets, held);
      stats->peak_set_bytes = std::max(stats->peak_set_bytes, bytes);
    }
    if (k == last_group[m]) {  // the set is done: its inputs go back, the rest is dropped
      open[m] = false;
      for (std::size_t i = 0; i < own.size(); ++i) {
        const auto v = static_cast<std::size_t>(own[i]);
        if (v < micro_inputs.size() && !micro_inputs[v].empty()) {
          micro_inputs[v][m] = std::move(sets[m][i]);
        } else {
          sets[m][i] = Tensor();
        }
      }
    }
  }
  // What this device only collects (a value the leader reports, fetched from the last stage):
  // every micro-batch's, after the stage's own groups.
  if (!pipeline.deferred.empty()) {
    for (std::size_t m = 0; m < M; ++m) {
      TaskTimes times;
      run_group(pipeline.deferred, m, times);
    }
  }
  std::vector<Event> posted;
  for (const PendingSend& s : sending) posted.push_back(s.done);
  when_all(posted).wait(world.default_timeout());
  if (stats) {
    stats->window_s = first_start < 0 ? 0 : last_end - first_start;
    stats->busy_s = busy;
  }
  options.times = caller_times;
  options.only = nullptr;
  options.tagged = nullptr;
  options.sending = nullptr;
  options.accumulate = false;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    if (micro_batches > 1) scale_in_place(sums[i], 1.0 / micro_batches);
    values[static_cast<std::size_t>(dt.accumulated[i])] = std::exchange(sums[i], Tensor());
  }
  options.part = TaskPart::kOncePerStep;
  options.beside = base;
  run_tasks(graph, dt, world, values, options);
}

}  // namespace meshflow
