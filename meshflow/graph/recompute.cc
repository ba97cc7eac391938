// Activation recomputation: which forward values backward reads again from copies made just
// before it, and the copies.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(std::string_view text) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (text == to_string(r)) return r;
  fail(ErrorKind::kInvalidArgument,
       "unknown recompute policy \"{}\" (expected none, selective or full)", text);
}

bool marks_checkpoint(const Pcg& pcg) {
  return std::any_of(pcg.nodes.begin(), pcg.nodes.end(),
                     [](const Node& n) { return n.checkpoint && n.phase == Phase::kForward; });
}

bool keeps_result(Recompute policy, const Node& n) {
  if (policy == Recompute::kNone || n.checkpoint) return true;
  const OpType t = n.op.type;
  return policy == Recompute::kSelective &&
         (t == OpType::kLinear || t == OpType::kMatmul || t == OpType::kMatmulGradA ||
          t == OpType::kMatmulGradB || t == OpType::kAttention || t == OpType::kAdd);
}

namespace {

std::vector<DeviceId> sorted_devices(const Layout& l) {
  std::vector<DeviceId> d = l.mesh.devices;
  std::sort(d.begin(), d.end());
  return d;
}

// Whether `policy` recomputes forward node `id` where backward reads it. Sources and marked
// values are always kept; selective keeps moves too (a collective is no cheap recomputation),
// and full keeps a move that brings a value from other devices (a later pipeline stage's
// input: recomputing it would send it again in backward).
bool recomputed(const Pcg& pcg, ValueId id, Recompute policy) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(id)];
  if (n.phase != Phase::kForward || n.checkpoint) return false;
  switch (n.kind) {
    case NodeKind::kCompute:
      return !keeps_result(policy, n);
    case NodeKind::kMove:
    case NodeKind::kParallel:
      return policy == Recompute::kFull && !n.replaces &&
             sorted_devices(*pcg.nodes[static_cast<std::size_t>(n.inputs[0])].layout) ==
                 sorted_devices(*n.layout);
    default:
      return false;
  }
}

}  // namespace

Pcg recompute_activations(Pcg pcg, Recompute policy) {
  if (policy == Recompute::kNone) return pcg;
  verify(pcg, Stage::kCopied);
  if (policy == Recompute::kFull && !marks_checkpoint(pcg)) {
    fail(ErrorKind::kInvalidArgument,
         "--recompute full: the model marks no node \"checkpoint\": true, so it has no segments "
         "to recompute (mark each block's input, or use --recompute selective)");
  }
  const std::size_t n = pcg.nodes.size();
  // Forward values backward reads (what --recompute none keeps).
  std::vector<bool> read_back(n, false);
  for (const Node& node : pcg.nodes)
    if (node.phase == Phase::kBackward)
      for (ValueId u : node.inputs) read_back[static_cast<std::size_t>(u)] = true;
  std::vector<bool> again(n, false);
  for (std::size_t id = 0; id < n; ++id) {
    again[id] = recomputed(pcg, static_cast<ValueId>(id), policy);
    // Selective recomputes only from what backward keeps anyway (sources, values it reads, or
    // values recomputed themselves): a view of a product backward does not read (a head's
    // transpose) stays kept rather than keep the product instead.
    if (again[id] && policy == Recompute::kSelective) {
      for (ValueId u : pcg.nodes[id].inputs) {
        const auto ui = static_cast<std::size_t>(u);
        const NodeKind k = pcg.nodes[ui].kind;
        const bool source =
            k == NodeKind::kInput || k == NodeKind::kWeight || k == NodeKind::kState;
        if (!source && !read_back[ui] && !again[ui]) again[id] = false;
      }
    }
  }
  std::set<std::string> taken;
  for (const Node& node : pcg.nodes) taken.insert(node.name);
  Pcg out;
  out.nodes.reserve(2 * n);
  std::vector<ValueId> remap(n, -1), copy_of(n, -1);
  // The copy of forward value v in backward, made (with the copies it reads) at first need.
  std::function<ValueId(ValueId)> copy = [&](ValueId v) -> ValueId {
    const auto i = static_cast<std::size_t>(v);
    if (copy_of[i] >= 0) return copy_of[i];
    Node c = pcg.nodes[i];
    for (ValueId& u : c.inputs)
      u = again[static_cast<std::size_t>(u)] ? copy(u) : remap[static_cast<std::size_t>(u)];
    std::string name = "recompute:" + c.name;
    for (int k = 2; taken.contains(name); ++k) name = fmt::format("recompute:{}#{}", c.name, k);
    taken.insert(name);
    c.name = std::move(name);
    c.phase = Phase::kBackward;
    c.recomputes = remap[i];
    c.checkpoint = false;
    out.nodes.push_back(std::move(c));
    return copy_of[i] = static_cast<ValueId>(out.nodes.size() - 1);
  };
  for (std::size_t id = 0; id < n; ++id) {
    Node node = pcg.nodes[id];
    MESHFLOW_CHECK(!node.decomposed, "recompute_activations runs before decompose_collectives");
    const bool backward = node.phase == Phase::kBackward;
    for (ValueId& u : node.inputs) {
      const auto ui = static_cast<std::size_t>(u);
      u = backward && again[ui] ? copy(u) : remap[ui];
    }
    if (node.replaces) node.replaces = remap[static_cast<std::size_t>(*node.replaces)];
    if (node.recomputes) node.recomputes = remap[static_cast<std::size_t>(*node.recomputes)];
    out.nodes.push_back(std::move(node));
    remap[id] = static_cast<ValueId>(out.nodes.size() - 1);
  }
  carry_names(pcg, remap, out);
  verify(out, Stage::kCopied);
  return out;
}

std::vector<RecomputedSegment> recomputed_segments(const Pcg& pcg) {
  // A forward node's segment: the most marked values on a path from a source to it, a marked
  // node ending its own segment (its readers start the next).
  std::vector<int> segment(pcg.nodes.size(), 0);
  for (std::size_t id = 0; id < pcg.nodes.size(); ++id) {
    for (ValueId u : pcg.nodes[id].inputs) {
      const Node& in = pcg.nodes[static_cast<std::size_t>(u)];
      const int after = segment[static_cast<std::size_t>(u)] +
                        (in.checkpoint && in.phase == Phase::kForward ? 1 : 0);
      segment[id] = std::max(segment[id], after);
    }
  }
  std::map<int, std::vector<std::string>> by_segment;
  for (const Node& node : pcg.nodes) {
    if (!node.recomputes) continue;
    const auto o = static_cast<std::size_t>(*node.recomputes);
    by_segment[segment[o]].push_back(pcg.nodes[o].name);
  }
  std::vector<RecomputedSegment> out;
  for (auto& [s, names] : by_segment) out.push_back({s, std::move(names)});
  return out;
}

}  // namespace meshflow
