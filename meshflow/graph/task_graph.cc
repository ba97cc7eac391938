// Shard expansion: plans once per (from, to), programs once per (plan, device), then per device
// its tasks, their dependencies and releases.
#include "meshflow/graph/task_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/op.h"
#include "meshflow/plan/plan_cache.h"

namespace meshflow {

namespace {

bool is_source(NodeKind kind) {
  return kind == NodeKind::kInput || kind == NodeKind::kWeight || kind == NodeKind::kState;
}

// Returns `device`'s part of its shard of `layout` in the squared norm: its index among the
// devices holding the same shard (its coordinates on the mesh dims where the layout is
// Replicate, in row-major order) and their count.
NormTerm norm_term(ValueId value, const Layout& layout, DeviceId device) {
  const std::vector<std::int64_t> coords = coordinates(layout.mesh, device);
  NormTerm t{.value = value};
  for (std::size_t j = 0; j < layout.placements.size(); ++j) {
    if (!layout.placements[j].is_replicate()) continue;
    const auto size = static_cast<int>(layout.mesh.shape[j]);
    t.part = t.part * size + static_cast<int>(coords[j]);
    t.parts *= size;
  }
  return t;
}

// Adds deps (producers of what a task reads, and for an in-place update the readers since)
// and releases (after each value's last use on this device).
void link(DeviceTasks& dt, std::size_t values, const std::set<ValueId>& keep) {
  std::vector<int> writer(values, -1);
  std::unordered_map<ValueId, std::vector<int>> readers;  // of values written in place only
  for (const Task& task : dt.tasks)
    for (ValueId v : writes_in_place(task)) readers[v];
  std::vector<int> last_use(values, -1);
  std::vector<ValueId> reads, made, writes;  // per task, their storage reused
  for (std::size_t t = 0; t < dt.tasks.size(); ++t) {
    Task& task = dt.tasks[t];
    task_reads(task, reads);
    // An update writes its weight and state in place, a replacing move its weight; every
    // other task writes its own value, and a fused kernel's the others' values, a decomposed
    // gather its operand 0 as gathered.
    const std::vector<ValueId> in_place = std::holds_alternative<ComputeTask>(task.work)
                                              ? std::vector<ValueId>{}
                                              : writes_in_place(task);
    writes.clear();
    if (in_place.empty()) {
      writes.push_back(task.out);
      values_made(task, made);
      for (ValueId v : made)
        if (v != task.out) writes.push_back(v);
    } else {
      writes = in_place;
    }
    std::vector<int>& deps = task.deps;  // sorted and made unique below
    deps.clear();
    for (ValueId v : reads) {
      const auto i = static_cast<std::size_t>(v);
      if (writer[i] >= 0) deps.push_back(writer[i]);
      if (!readers.empty())
        if (auto r = readers.find(v); r != readers.end()) r->second.push_back(static_cast<int>(t));
      last_use[i] = static_cast<int>(t);
    }
    for (ValueId v : in_place)
      for (int r : readers[v])
        if (r != static_cast<int>(t)) deps.push_back(r);
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    for (ValueId v : writes) {
      const auto written = static_cast<std::size_t>(v);
      writer[written] = static_cast<int>(t);
      if (!readers.empty())
        if (auto r = readers.find(v); r != readers.end()) r->second.clear();
      if (last_use[written] < static_cast<int>(t)) last_use[written] = static_cast<int>(t);
    }
  }
  for (std::size_t v = 0; v < values; ++v) {
    if (last_use[v] < 0 || keep.count(static_cast<ValueId>(v))) continue;
    dt.tasks[static_cast<std::size_t>(last_use[v])].release.push_back(static_cast<ValueId>(v));
  }
}

// Returns, per node, whether it runs once per step: an update-phase node, a node reading one's
// value, or one after an update that reads what the update wrote in place (a weight, a state).
// Decided on the graph, so every device of a collective puts it in the same part.
std::vector<bool> once_per_step(const Pcg& pcg) {
  std::vector<bool> once(pcg.nodes.size(), false);
  std::set<ValueId> updated;  // weights and states an earlier update wrote
  for (std::size_t id = 0; id < pcg.nodes.size(); ++id) {
    const Node& n = pcg.nodes[id];
    bool o = n.phase == Phase::kUpdate;
    for (ValueId v : n.inputs) o = o || once[static_cast<std::size_t>(v)] || updated.count(v);
    once[id] = o;
    if (n.kind == NodeKind::kUpdate) {
      updated.insert(n.inputs[0]);
      updated.insert(n.inputs.begin() + 3, n.inputs.end());
    }
    if (n.replaces) updated.insert(*n.replaces);
  }
  return once;
}

// Marks the tasks that run once per step (`once`), lists the values the per-micro-batch tasks
// make for them or for the caller, and marks the kernels that can add into those values' sums.
void split_by_micro_batch(DeviceTasks& dt, const Pcg& pcg, const std::set<ValueId>& keep,
                          const std::vector<bool>& once) {
  // Per value (ValueIds are dense): read by a once-per-step task, read and made by a
  // per-micro-batch task, accumulated.
  const std::size_t values = pcg.nodes.size();
  std::vector<char> read_once(values, 0), read_per_micro_batch(values, 0),
      made_per_micro_batch(values, 0), accumulated(values, 0);
  std::vector<ValueId> reads, made;  // per task, their storage reused
  for (Task& task : dt.tasks) {
    task.once_per_step = once[static_cast<std::size_t>(task.out)];
    std::vector<char>& read = task.once_per_step ? read_once : read_per_micro_batch;
    task_reads(task, reads);
    for (ValueId v : reads) read[static_cast<std::size_t>(v)] = 1;
    if (task.once_per_step) continue;
    values_made(task, made);
    for (ValueId v : made) made_per_micro_batch[static_cast<std::size_t>(v)] = 1;
  }
  for (std::size_t v = 0; v < values; ++v) {
    if (!made_per_micro_batch[v]) continue;
    const Node& n = pcg.nodes[v];
    if (is_floating(n.spec.dtype) && (read_once[v] || keep.count(static_cast<ValueId>(v)))) {
      dt.accumulated.push_back(static_cast<ValueId>(v));
      accumulated[v] = 1;
    }
  }
  for (Task& task : dt.tasks) {
    const auto* compute = std::get_if<ComputeTask>(&task.work);
    const auto out = static_cast<std::size_t>(task.out);
    task.accumulates =
        compute && compute->fused.empty() && accumulated[out] && !read_per_micro_batch[out];
    if (compute && compute->call->op.type == OpType::kReshape) {
      const ValueId in = compute->call->args[0];
      task.reuses_input =
          std::find(task.release.begin(), task.release.end(), in) != task.release.end() &&
          !accumulated[static_cast<std::size_t>(in)];
    }
  }
}

}  // namespace

std::vector<ValueId> task_reads(const Task& task) {
  std::vector<ValueId> reads;
  task_reads(task, reads);
  return reads;
}

void task_reads(const Task& task, std::vector<ValueId>& reads) {
  reads.clear();
  std::visit(
      [&](const auto& w) {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, ComputeTask>)
          reads.insert(reads.end(), w.call->args.begin(), w.call->args.end());
        if constexpr (std::is_same_v<W, OverlapTask>) {
          reads.insert(reads.end(), w.call->args.begin(), w.call->args.end());
          if (w.decomposition.kind == Decomposition::Kind::kGatherOperand) reads[0] = w.source;
        }
        if constexpr (std::is_same_v<W, MoveTask>) reads.push_back(w.input);
        if constexpr (std::is_same_v<W, UpdateTask>) {
          reads.insert(reads.end(), {w.weight, w.grad, w.norm});
          reads.insert(reads.end(), w.state.begin(), w.state.end());
        }
        if constexpr (std::is_same_v<W, GradNormTask>) {
          for (const NormTerm& t : w.counted) reads.push_back(t.value);
          if (w.loss) reads.push_back(*w.loss);
        }
      },
      task.work);
}

std::vector<bool> accumulated_in_place(const DeviceTasks& dt) {
  std::set<ValueId> accumulating;
  for (const Task& t : dt.tasks)
    if (t.accumulates) accumulating.insert(t.out);
  std::vector<bool> in_place;
  for (ValueId v : dt.accumulated) in_place.push_back(accumulating.count(v) > 0);
  return in_place;
}

bool makes_value(const Task& task) {
  if (const auto* m = std::get_if<MoveTask>(&task.work)) return m->program->in_to && !m->replaces;
  return !std::holds_alternative<UpdateTask>(task.work);
}

std::vector<ValueId> values_made(const Task& task) {
  std::vector<ValueId> made;
  values_made(task, made);
  return made;
}

void values_made(const Task& task, std::vector<ValueId>& made) {
  made.clear();
  if (makes_value(task)) made.push_back(task.out);
  if (const auto* c = std::get_if<ComputeTask>(&task.work))
    for (const FusedKernel& f : c->fused) made.push_back(f.out);
  if (const auto* o = std::get_if<OverlapTask>(&task.work);
      o && o->decomposition.kind == Decomposition::Kind::kGatherOperand)
    made.push_back(o->call->args[0]);
}

std::vector<ValueId> writes_in_place(const Task& task) {
  if (const auto* u = std::get_if<UpdateTask>(&task.work)) {
    std::vector<ValueId> w = {u->weight};
    w.insert(w.end(), u->state.begin(), u->state.end());
    return w;
  }
  if (const auto* m = std::get_if<MoveTask>(&task.work); m && m->replaces) return {*m->replaces};
  return {};
}

std::int64_t shard_bytes(const TaskGraph& g, ValueId v, DeviceId device) {
  const Layout& l = g.layouts[static_cast<std::size_t>(v)];
  if (!find_device(l.mesh, device)) return 0;
  return numel(local_shape(l, device)) * static_cast<std::int64_t>(size_of(l.dtype));
}

std::vector<DeviceId> pcg_devices(const Pcg& pcg) {
  std::set<DeviceId> devices;
  for (const Node& n : pcg.nodes) {
    MESHFLOW_CHECK(n.layout.has_value(), "node \"{}\" has no layout", n.name);
    devices.insert(n.layout->mesh.devices.begin(), n.layout->mesh.devices.end());
  }
  return {devices.begin(), devices.end()};
}

TaskGraph expand_shards(const Pcg& pcg, const std::vector<ValueId>& keep_values,
                        const PlanOptions& options) {
  verify(pcg, Stage::kCopied);
  TaskGraph g;
  for (const Node& n : pcg.nodes) {
    g.names.push_back(n.name);
    g.layouts.push_back(*n.layout);
  }
  std::set<ValueId> keep(keep_values.begin(), keep_values.end());
  const std::vector<DeviceId> devices = pcg_devices(pcg);
  std::map<DeviceId, std::size_t> index;
  for (DeviceId d : devices) {
    index[d] = g.devices.size();
    g.devices.push_back(DeviceTasks{.device = d});
  }
  PlanCache plans(options);
  // Decomposed collectives: a gather's movement runs inside its product's task; a scatter's
  // product runs inside its movement's task.
  std::vector<bool> absorbed(pcg.nodes.size(), false);
  std::vector<ValueId> scatter_of(pcg.nodes.size(), -1);  // movement -> its product
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
    const auto& d = pcg.nodes[static_cast<std::size_t>(id)].decomposed;
    if (!d) continue;
    if (d->kind == Decomposition::Kind::kGatherOperand) {
      absorbed[static_cast<std::size_t>(d->move)] = true;
    } else {
      absorbed[static_cast<std::size_t>(id)] = true;
      scatter_of[static_cast<std::size_t>(d->move)] = id;
    }
  }
  // Kernels that run as one (ops/op.h's runs_together: attention's gradients, layer norm's
  // weight gradients) on the same devices in the same pass run in one task, in the first one's
  // place: the group's operands are its longest member's (the others' a prefix of them), all
  // made before the first. A value of such a task that is summed over micro-batches is made and
  // then added, never added into by the kernel (Task::accumulates).
  const std::vector<bool> once = once_per_step(pcg);
  std::vector<std::vector<ValueId>> group(pcg.nodes.size());  // first -> its members, in order
  {
    auto node = [&](ValueId v) -> const Node& { return pcg.nodes[static_cast<std::size_t>(v)]; };
    std::map<ValueId, std::vector<ValueId>> firsts;  // operand 0 -> the groups' firsts
    for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
      const Node& n = node(id);
      if (n.kind != NodeKind::kCompute || n.decomposed || n.inputs.empty()) continue;
      const auto joins = [&](ValueId first) {
        const Node& f = node(first);
        if (f.layout->mesh != n.layout->mesh || f.phase != n.phase ||
            once[static_cast<std::size_t>(first)] != once[static_cast<std::size_t>(id)])
          return false;
        const std::vector<ValueId>* longest = &n.inputs;
        for (ValueId m : group[static_cast<std::size_t>(first)])
          if (node(m).inputs.size() > longest->size()) longest = &node(m).inputs;
        for (ValueId m : group[static_cast<std::size_t>(first)]) {
          const std::vector<ValueId>& in = node(m).inputs;
          if (!std::equal(in.begin(), in.end(), longest->begin())) return false;
        }
        if (!std::equal(n.inputs.begin(), n.inputs.end(), longest->begin()) ||
            std::any_of(longest->begin(), longest->end(), [&](ValueId v) { return v >= first; }))
          return false;
        std::vector<TensorSpec> specs;
        for (ValueId v : *longest) specs.push_back(node(v).spec);
        return std::all_of(group[static_cast<std::size_t>(first)].begin(),
                           group[static_cast<std::size_t>(first)].end(),
                           [&](ValueId m) { return runs_together(node(m).op, n.op, specs); });
      };
      std::vector<ValueId>& candidates = firsts[n.inputs[0]];
      const auto first = std::find_if(candidates.begin(), candidates.end(), joins);
      if (first == candidates.end()) {
        candidates.push_back(id);
        group[static_cast<std::size_t>(id)] = {id};
      } else {
        group[static_cast<std::size_t>(*first)].push_back(id);
        absorbed[static_cast<std::size_t>(id)] = true;
      }
    }
  }
  // Which devices run each node (a move: its plan's, with their programs), counted first so
  // that every device's task list is allocated once.
  using Programs = std::vector<std::pair<DeviceId, std::shared_ptr<const DeviceProgram>>>;
  std::vector<Programs> moves(pcg.nodes.size());
  std::vector<std::size_t> count(g.devices.size(), 0);
  for (std::size_t id = 0; id < pcg.nodes.size(); ++id) {
    const Node& n = pcg.nodes[id];
    if (is_source(n.kind) || absorbed[id]) continue;
    if ((n.kind == NodeKind::kMove || n.kind == NodeKind::kParallel) && scatter_of[id] < 0) {
      moves[id] =
          plans.programs(*pcg.nodes[static_cast<std::size_t>(n.inputs[0])].layout, *n.layout);
      for (const auto& [d, program] : moves[id]) ++count[index[d]];
    } else {
      for (DeviceId d : n.layout->mesh.devices) ++count[index[d]];
    }
  }
  for (std::size_t i = 0; i < g.devices.size(); ++i) g.devices[i].tasks.reserve(count[i]);
  auto kernel_call = [&](const Node& n) {
    std::vector<TensorSpec> globals;
    for (ValueId v : n.inputs) globals.push_back(pcg.nodes[static_cast<std::size_t>(v)].spec);
    const Op op = normalize(n.op, globals);
    return std::make_shared<const KernelCall>(KernelCall{op, globals, n.inputs});
  };
  // The overlapped loop of product `c` on each of `layout`'s devices, making value `out`.
  auto add_overlap = [&](ValueId out, const Node& c, const Layout& layout) {
    const Decomposition& d = *c.decomposed;
    auto call = kernel_call(c);
    const Node& a = pcg.nodes[static_cast<std::size_t>(c.inputs[0])];
    for (DeviceId dev : layout.mesh.devices) {
      OverlapTask o{.call = call,
                    .decomposition = d,
                    .source = d.kind == Decomposition::Kind::kGatherOperand ? a.inputs[0] : 0,
                    .group = group_along(layout.mesh, dev, {d.mesh_dim}),
                    .rows = local_shape(*a.layout, dev)[0],
                    .local_out = local_shape(layout, dev)};
      g.devices[index[dev]].tasks.push_back(
          Task{.out = out, .phase = c.phase, .work = std::move(o)});
    }
  };
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(id)];
    const Layout& layout = *n.layout;
    const std::vector<DeviceId>& on = layout.mesh.devices;
    if (absorbed[static_cast<std::size_t>(id)]) continue;
    switch (n.kind) {
      case NodeKind::kInput:
      case NodeKind::kWeight:
      case NodeKind::kState:
        keep.insert(id);
        for (DeviceId d : on) g.devices[index[d]].sources.push_back(id);
        break;
      case NodeKind::kCompute: {
        if (n.decomposed) {
          add_overlap(id, n, layout);
          break;
        }
        // The group's member with the most operands makes the call; the others run fused.
        const std::vector<ValueId>& members = group[static_cast<std::size_t>(id)];
        const ValueId primary =
            *std::max_element(members.begin(), members.end(), [&](ValueId a, ValueId b) {
              return pcg.nodes[static_cast<std::size_t>(a)].inputs.size() <
                     pcg.nodes[static_cast<std::size_t>(b)].inputs.size();
            });
        const Node& p = pcg.nodes[static_cast<std::size_t>(primary)];
        auto call = kernel_call(p);
        std::vector<std::pair<ValueId, Op>> siblings;  // normalised once, run on every device
        for (ValueId o : members)
          if (o != primary)
            siblings.emplace_back(o, kernel_call(pcg.nodes[static_cast<std::size_t>(o)])->op);
        // An operand on the product's own mesh (most are) takes the device's coordinates
        // found once.
        std::vector<char> own_mesh;
        for (ValueId v : p.inputs)
          own_mesh.push_back(pcg.nodes[static_cast<std::size_t>(v)].layout->mesh == p.layout->mesh);
        for (DeviceId d : on) {
          const std::vector<std::int64_t> coords = coordinates(p.layout->mesh, d);
          ShardOffsets offsets;
          offsets.reserve(p.inputs.size());
          for (std::size_t i = 0; i < p.inputs.size(); ++i) {
            const Layout& l = *pcg.nodes[static_cast<std::size_t>(p.inputs[i])].layout;
            offsets.push_back(own_mesh[i] ? shard_box_at(l, coords).offset
                                          : shard_box(l, d).offset);
          }
          ComputeTask c{call, shard_box_at(*p.layout, coords).extent, std::move(offsets)};
          for (const auto& [o, op] : siblings) {
            c.fused.push_back(FusedKernel{
                .out = o,
                .op = op,
                .local_out = local_shape(*pcg.nodes[static_cast<std::size_t>(o)].layout, d)});
          }
          g.devices[index[d]].tasks.push_back(
              Task{.out = primary, .phase = n.phase, .work = std::move(c)});
        }
        break;
      }
      case NodeKind::kParallel:
      case NodeKind::kMove:
        if (const ValueId c = scatter_of[static_cast<std::size_t>(id)]; c >= 0) {
          add_overlap(id, pcg.nodes[static_cast<std::size_t>(c)], layout);
          break;
        }
        for (auto& [d, program] : moves[static_cast<std::size_t>(id)]) {
          // An update's value is its weight (or chunk), written in place.
          const Node& in = pcg.nodes[static_cast<std::size_t>(n.inputs[0])];
          const ValueId read = in.kind == NodeKind::kUpdate ? in.inputs[0] : n.inputs[0];
          g.devices[index[d]].tasks.push_back(
              Task{.out = id,
                   .phase = n.phase,
                   .work = MoveTask{read, std::move(program), n.replaces},
                   .asynchronous = n.zero_gather});
        }
        break;
      case NodeKind::kGradNorm:
        for (DeviceId d : on) {
          GradNormTask t;
          for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            const Layout& l = n.operand_layouts[i];
            if (!find_device(l.mesh, d)) continue;
            if (i == 0) {
              t.loss = n.inputs[0];
            } else {
              t.counted.push_back(norm_term(n.inputs[i], l, d));
            }
          }
          g.devices[index[d]].tasks.push_back(Task{.out = id, .phase = n.phase, .work = t});
        }
        break;
      case NodeKind::kUpdate:
        for (DeviceId d : on) {
          UpdateTask u{.weight = n.inputs[0],
                       .grad = n.inputs[1],
                       .norm = n.inputs[2],
                       .state = {n.inputs.begin() + 3, n.inputs.end()},
                       .rule = n.update};
          g.devices[index[d]].tasks.push_back(
              Task{.out = id, .phase = n.phase, .work = std::move(u)});
        }
        break;
    }
  }
  // Each device's list is linked on its own: the devices split over this machine's cores.
  const int parts = std::max(1, std::min(available_cores(), static_cast<int>(g.devices.size())));
  ThreadTeam team(parts);
  team.run(parts, [&](int part) {
    const auto n = static_cast<std::int64_t>(g.devices.size());
    for (std::int64_t i = part_begin(n, parts, part, 1); i < part_begin(n, parts, part + 1, 1);
         ++i) {
      DeviceTasks& dt = g.devices[static_cast<std::size_t>(i)];
      link(dt, pcg.nodes.size(), keep);
      split_by_micro_batch(dt, pcg, keep, once);
    }
  });
  return g;
}

std::string to_text(const TaskGraph& graph) {
  std::string out;
  auto name = [&](ValueId v) { return graph.names[static_cast<std::size_t>(v)]; };
  for (const DeviceTasks& dt : graph.devices) {
    std::string sources;
    for (ValueId v : dt.sources) sources += (sources.empty() ? "" : ", ") + name(v);
    out += fmt::format("device {}  sources: {}\n", dt.device, sources);
    for (std::size_t t = 0; t < dt.tasks.size(); ++t) {
      const Task& task = dt.tasks[t];
      std::string what = std::visit(
          [&](const auto& w) -> std::string {
            using W = std::decay_t<decltype(w)>;
            if constexpr (std::is_same_v<W, ComputeTask>) {
              std::string args;
              for (ValueId v : w.call->args) args += (args.empty() ? "" : ", ") + name(v);
              std::string made =
                  fmt::format("{}({}) -> {}", to_string(w.call->op), args, to_string(w.local_out));
              for (const FusedKernel& f : w.fused)
                made += fmt::format(", with {} = {} -> {}", name(f.out), to_string(f.op),
                                    to_string(f.local_out));
              return made;
            } else if constexpr (std::is_same_v<W, MoveTask>) {
              std::string steps;
              for (const DeviceStep& s : w.program->steps)
                steps += (steps.empty() ? "" : " ") + std::string(to_string(s.kind));
              return fmt::format("move({}) [{}] -> {}{}", name(w.input), steps,
                                 to_string(w.program->out_shape),
                                 w.replaces ? " replacing " + name(*w.replaces) : "");
            } else if constexpr (std::is_same_v<W, OverlapTask>) {
              std::string args;
              for (ValueId v : w.call->args) args += (args.empty() ? "" : ", ") + name(v);
              const bool gather = w.decomposition.kind == Decomposition::Kind::kGatherOperand;
              return fmt::format(
                  "{}({}) {} over [{}] -> {}", to_string(w.call->op), args,
                  gather ? fmt::format("gathering {} by {}", name(w.source),
                                       to_string(w.decomposition.form))
                         : fmt::format("reduce-scattered by {}", to_string(w.decomposition.form)),
                  fmt::join(w.group, ","), to_string(w.local_out));
            } else if constexpr (std::is_same_v<W, GradNormTask>) {
              std::string args = w.loss ? fmt::format("loss {}", name(*w.loss)) : "";
              for (const NormTerm& c : w.counted) {
                args += (args.empty() ? "" : ", ") + name(c.value);
                if (c.parts > 1) args += fmt::format(" part {}/{}", c.part + 1, c.parts);
              }
              return fmt::format("grad_norm_sq_term({})", args);
            } else {
              std::string args =
                  fmt::format("{}, {}, {}", name(w.weight), name(w.grad), name(w.norm));
              for (ValueId v : w.state) args += ", " + name(v);
              return fmt::format("{}({})", to_string(w.rule.kind), args);
            }
          },
          task.work);
      std::string release;
      for (ValueId v : task.release) release += (release.empty() ? "" : ", ") + name(v);
      out += fmt::format("  {:3} {} = {}  [{}]", t, name(task.out), what, to_string(task.phase));
      if (!task.deps.empty()) out += fmt::format("  after {}", fmt::join(task.deps, ","));
      if (!release.empty()) out += fmt::format("  drops {}", release);
      out += "\n";
    }
  }
  return out;
}

}  // namespace meshflow
