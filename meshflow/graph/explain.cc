// The explanation of a compiled graph, as data, JSON and text.
#include "meshflow/graph/explain.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/plan/plan_cache.h"

namespace meshflow {

Explanation explain(const Pcg& pcg, const PlanOptions& options, const DecomposeOptions* overlap) {
  verify(pcg, Stage::kCopied);
  Explanation e;
  PlanCache plans(options);  // a deep model repeats a few moves many times
  std::vector<std::pair<ValueId, std::string>> named;
  for (const auto& [name, id] : pcg.names) named.emplace_back(id, name);
  std::sort(named.begin(), named.end());
  for (const auto& [id, name] : named)
    e.values.emplace_back(name, *pcg.nodes[static_cast<std::size_t>(id)].layout);
  const MachineModel& machine = options.machine ? *options.machine : default_machine();
  std::vector<ValueId> decomposed_by(pcg.nodes.size(), -1);  // movement -> its product
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
    if (const auto& d = pcg.nodes[static_cast<std::size_t>(id)].decomposed)
      decomposed_by[static_cast<std::size_t>(d->move)] = id;
  }
  // movement -> the loop the cost model declined for it
  std::vector<std::optional<OverlapEstimate>> kept_whole(pcg.nodes.size());
  if (overlap != nullptr) {
    const std::vector<std::optional<Decomposition>> allowed = decomposable(pcg);
    for (std::size_t id = 0; id < allowed.size(); ++id) {
      if (!allowed[id] || pcg.nodes[id].decomposed) continue;
      kept_whole[static_cast<std::size_t>(allowed[id]->move)] =
          choose_decomposition(pcg, pcg.nodes[id], *allowed[id], machine, *overlap).estimate;
    }
  }
  for (std::size_t id = 0; id < pcg.nodes.size(); ++id) {
    const Node& n = pcg.nodes[id];
    if (n.kind != NodeKind::kMove && n.kind != NodeKind::kParallel) continue;
    const Node& in = pcg.nodes[static_cast<std::size_t>(n.inputs[0])];
    MoveReport m{.value = n.kind == NodeKind::kMove ? n.moved_value : in.name,
                 .consumer = n.kind == NodeKind::kMove ? n.consumer : n.name,
                 .phase = n.phase,
                 .from = *in.layout,
                 .to = *n.layout};
    if (n.zero_gather) m.freed_after = n.consumer;
    if (const ValueId c = decomposed_by[id]; c >= 0) {
      const Node& product = pcg.nodes[static_cast<std::size_t>(c)];
      const Decomposition& d = *product.decomposed;
      const OverlapCostInput cost = overlap_cost_input(pcg, product, d);
      const int group = static_cast<int>(cost.block_bytes.size());
      const bool gather = d.kind == Decomposition::Kind::kGatherOperand;
      if (d.form == GatherForm::kPermute) {
        m.steps.assign(static_cast<std::size_t>(group - 1), StepKind::kPermute);
      } else if (d.form == GatherForm::kBroadcast) {
        m.steps.assign(static_cast<std::size_t>(group), StepKind::kBroadcast);
      } else {
        m.steps = {StepKind::kInPlace};
      }
      const OverlapEstimate t = gather ? gather_overlap(machine, cost, d.form)
                                       : reduce_scatter_overlap(machine, cost, d.form);
      m.overlapped_with = product.name;
      m.est_s = std::max(0.0, t.overlapped_s - t.product_s);
      e.moves.push_back(std::move(m));
      continue;
    }
    const std::shared_ptr<const Plan> plan = plans.get(*in.layout, *n.layout);
    m.est_s = plan->est_s;
    m.kept_whole = kept_whole[id];
    for (const Step& s : plan->steps)
      if (s.kind != StepKind::kLocal) m.steps.push_back(s.kind);
    if (!m.steps.empty()) e.moves.push_back(std::move(m));
  }
  return e;
}

nlohmann::json layout_json(const Layout& l) {
  nlohmann::json placements = nlohmann::json::array();
  for (const Placement& p : l.placements) placements.push_back(to_string(p));
  return {{"mesh", explicit_text(l.mesh)}, {"placements", placements}};
}

std::string explicit_text(const DeviceMesh& mesh) {
  return fmt::format("{}@{}", fmt::join(mesh.shape, "x"), fmt::join(mesh.devices, ","));
}

Explanation explain_compiled(const Pcg& pcg, const CompileOptions& options) {
  const Pcg g = compile(pcg, pcg.loss ? Mode::kTrain : Mode::kRun, options);
  Explanation e = explain(g, options.plan, options.overlap ? &options.decompose : nullptr);
  if (!pcg.loss) return e;
  e.recompute = recomputed_segments(g);
  // The runtime keeps the loss and the squared norm for its report; the rest as the step runs.
  std::vector<ValueId> keep = {*g.loss};
  if (auto norm = find_grad_norm(g)) keep.push_back(*norm);
  const TaskGraph tasks = expand_shards(g, keep, options.plan);
  for (const DeviceMemory& d : estimate_memory(g, tasks, options.micro_batches)) {
    if (!e.memory || d.peak > e.memory->peak) e.memory = d;
  }
  for (const StepTime& t : estimate_step_time(g, tasks, options.micro_batches, options.plan,
                                              options.threads_per_device)) {
    if (!e.step_time || t.total() > e.step_time->total()) e.step_time = t;
  }
  return e;
}

nlohmann::json to_json(const Explanation& e) {
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [name, layout] : e.values) values[name] = layout_json(layout);
  nlohmann::json moves = nlohmann::json::array();
  for (const MoveReport& m : e.moves) {
    nlohmann::json steps = nlohmann::json::array();
    for (StepKind k : m.steps) steps.push_back(std::string(to_string(k)));
    moves.push_back({{"value", m.value},
                     {"consumer", m.consumer},
                     {"pass", std::string(to_string(m.phase))},
                     {"from", layout_json(m.from)},
                     {"to", layout_json(m.to)},
                     {"steps", steps},
                     {"est_s", m.est_s}});
    if (!m.overlapped_with.empty()) moves.back()["overlapped_with"] = m.overlapped_with;
    if (!m.freed_after.empty()) moves.back()["freed_after"] = m.freed_after;
    if (m.kept_whole) {
      moves.back()["kept_whole"] = {{"loop_s", m.kept_whole->overlapped_s},
                                    {"sequential_s", m.kept_whole->sequential_s}};
    }
  }
  nlohmann::json out = {{"values", values}, {"moves", moves}};
  if (e.step_time) {
    out["est_step_s"] = e.step_time->total();
    out["est_step"] = {{"device", e.step_time->device},
                       {"compute_s", e.step_time->compute_s},
                       {"move_s", e.step_time->move_s},
                       {"update_s", e.step_time->update_s}};
  }
  if (e.memory) {
    out["memory_per_device_bytes"] = e.memory->peak;
    out["memory"] = to_json(e.memory->at_peak);
    nlohmann::json segments = nlohmann::json::array();
    for (const RecomputedSegment& r : e.recompute)
      segments.push_back({{"segment", r.segment}, {"nodes", r.nodes}});
    out["recompute"] = segments;
  }
  return out;
}

std::string to_text(const Explanation& e) {
  std::size_t width = 0;
  for (const auto& [name, layout] : e.values) width = std::max(width, name.size());
  std::string out = "values:\n";
  for (const auto& [name, layout] : e.values) {
    out +=
        fmt::format("  {:<{}}  {} {}  {} {}\n", name, width, explicit_text(layout.mesh),
                    to_string(layout.placements), to_string(layout.dtype), to_string(layout.shape));
  }
  for (Phase phase : {Phase::kForward, Phase::kBackward, Phase::kUpdate}) {
    out += fmt::format("{} moves:\n", to_string(phase));
    int count = 0;
    for (const MoveReport& m : e.moves) {
      if (m.phase != phase) continue;
      ++count;
      std::string steps;
      for (StepKind k : m.steps) steps += (steps.empty() ? "" : ", ") + std::string(to_string(k));
      const std::string from = m.from.mesh == m.to.mesh ? to_string(m.from.placements)
                                                        : explicit_text(m.from.mesh) + " " +
                                                              to_string(m.from.placements);
      const std::string to = m.from.mesh == m.to.mesh
                                 ? to_string(m.to.placements)
                                 : explicit_text(m.to.mesh) + " " + to_string(m.to.placements);
      if (!m.overlapped_with.empty()) steps += "; overlapped with " + m.overlapped_with;
      if (!m.freed_after.empty()) steps += "; freed after " + m.freed_after;
      if (m.kept_whole) {
        steps += fmt::format("; kept whole: loop est {:.3g} s vs {:.3g} s collective then product",
                             m.kept_whole->overlapped_s, m.kept_whole->sequential_s);
      }
      out += fmt::format("  {} for {}: {} -> {}  [{}]  est {:.3g} s\n", m.value, m.consumer, from,
                         to, steps, m.est_s);
    }
    if (count == 0) out += "  (none)\n";
  }
  if (e.step_time) {
    const StepTime& t = *e.step_time;
    out += fmt::format(
        "step time (estimated): {:.6g} s on its slowest device ({}): compute {:.6g} s, moves "
        "{:.6g} s, optimizer {:.6g} s\n",
        t.total(), t.device, t.compute_s, t.move_s, t.update_s);
  }
  if (e.memory) {
    const auto& b = e.memory->at_peak.bytes;
    out += fmt::format(
        "memory per device: {} bytes at its peak (device {}): weights {}, gradients {}, "
        "optimizer state {}, activations {}, gathered {}\n",
        e.memory->peak, e.memory->device, b[0], b[1], b[2], b[3], b[4]);
  }
  for (const RecomputedSegment& r : e.recompute) {
    out += fmt::format("recomputed in backward, segment {}: {}\n", r.segment,
                       fmt::join(r.nodes, ", "));
  }
  return out;
}

}  // namespace meshflow
