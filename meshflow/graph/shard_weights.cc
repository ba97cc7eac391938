// FSDP (graph/passes.h's shard_weights): weights that add_update updates in their ZeRO layout
// come to live there, every node that read one reads a gather made for it alone, issued one
// reader ahead, and each gradient is reduce-scattered as soon as it is made.
#include <fmt/format.h>

#include <map>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

Pcg shard_weights(Pcg pcg) {
  verify(pcg, Stage::kLaidOut);
  auto node = [&](ValueId v) -> const Node& { return pcg.nodes[static_cast<std::size_t>(v)]; };
  std::map<ValueId, Layout> sharded;  // weight -> its ZeRO layout
  for (const Node& u : pcg.nodes) {
    if (u.kind != NodeKind::kUpdate || node(u.inputs[0]).kind != NodeKind::kWeight) continue;
    if (*u.layout != *node(u.inputs[0]).layout) sharded.emplace(u.inputs[0], *u.layout);
  }
  if (sharded.empty()) return pcg;
  auto reads_sharded = [&](const Node& n) {
    if (n.kind == NodeKind::kUpdate) return false;  // it updates the shard in place
    for (ValueId v : n.inputs)
      if (sharded.count(v)) return true;
    return false;
  };
  // The readers in order; reader k's gathers go before reader k-1 (one ahead), or before
  // reader k itself when one of its weights comes later than reader k-1.
  std::vector<ValueId> readers;
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id)
    if (reads_sharded(node(id))) readers.push_back(id);
  std::map<ValueId, std::vector<ValueId>> gathers_before;  // node -> readers gathered there
  for (std::size_t k = 0; k < readers.size(); ++k) {
    ValueId slot = k == 0 ? readers[0] : readers[k - 1];
    for (ValueId v : node(readers[k]).inputs)
      if (sharded.count(v) && v >= slot) slot = readers[k];
    gathers_before[slot].push_back(readers[k]);
  }
  std::set<std::string> taken;
  for (const Node& n : pcg.nodes) taken.insert(n.name);
  auto unique = [&](const std::string& name) {
    std::string candidate = name;
    for (int k = 2; taken.count(candidate); ++k) candidate = fmt::format("{}#{}", name, k);
    taken.insert(candidate);
    return candidate;
  };
  // Each sharded weight's gradient is reduce-scattered into its shard (add_update's backward
  // move) right after the gradient is made, so the unsharded gradient is dropped at once rather
  // than held until every gradient is made.
  std::map<ValueId, std::vector<ValueId>> scattered_after;  // gradient -> its moves
  std::set<ValueId> scatters;
  for (const Node& u : pcg.nodes) {
    if (u.kind != NodeKind::kUpdate || !sharded.count(u.inputs[0])) continue;
    const ValueId m = u.inputs[1];
    if (node(m).kind != NodeKind::kMove || node(m).phase != Phase::kBackward) continue;
    scattered_after[node(m).inputs[0]].push_back(m);
    scatters.insert(m);
  }
  Pcg out;
  std::vector<ValueId> remap(pcg.nodes.size(), -1);
  std::map<std::pair<ValueId, ValueId>, ValueId> gathered;  // (reader, weight) -> new gather
  auto push = [&](Node n) {
    out.nodes.push_back(std::move(n));
    return static_cast<ValueId>(out.nodes.size() - 1);
  };
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
    if (scatters.count(id)) continue;  // placed after its gradient
    if (auto g = gathers_before.find(id); g != gathers_before.end()) {
      for (ValueId r : g->second) {
        const Node& reader = node(r);
        for (std::size_t i = 0; i < reader.inputs.size(); ++i) {
          const ValueId w = reader.inputs[i];
          if (!sharded.count(w) || gathered.count({r, w})) continue;
          // The layout the reader needs, or the weight's own where the reader is a movement
          // or needs a Partial term of it (no shard becomes one: copy insertion then moves
          // the gathered weight on, as it moved the weight before).
          const bool needs =
              reader.kind == NodeKind::kCompute || reader.kind == NodeKind::kGradNorm;
          const Layout to = needs && partial_dims(reader.operand_layouts[i]).empty()
                                ? reader.operand_layouts[i]
                                : *node(w).layout;
          Node m{.name = unique(fmt::format("gather:{}@{}", node(w).name, reader.name)),
                 .kind = NodeKind::kMove,
                 .phase = reader.phase,
                 .inputs = {remap[static_cast<std::size_t>(w)]},
                 .spec = node(w).spec};
          m.mesh = to.mesh;
          m.placements = to.placements;
          m.layout = to;
          m.moved_value = node(w).name;
          m.consumer = reader.name;
          m.zero_gather = true;
          gathered[{r, w}] = push(std::move(m));
        }
      }
    }
    Node n = node(id);
    const bool reader = reads_sharded(n);
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      n.inputs[i] =
          reader && sharded.count(v) ? gathered.at({id, v}) : remap[static_cast<std::size_t>(v)];
    }
    if (n.replaces) n.replaces = remap[static_cast<std::size_t>(*n.replaces)];
    if (auto s = sharded.find(id); s != sharded.end()) {
      n.layout = s->second;
      n.mesh = s->second.mesh;
      n.placements = s->second.placements;
    }
    remap[static_cast<std::size_t>(id)] = push(std::move(n));
    if (auto m = scattered_after.find(id); m != scattered_after.end()) {
      for (ValueId scatter : m->second) {
        Node moved = node(scatter);
        moved.inputs = {remap[static_cast<std::size_t>(id)]};
        remap[static_cast<std::size_t>(scatter)] = push(std::move(moved));
      }
    }
  }
  carry_names(pcg, remap, out);
  verify(out, Stage::kLaidOut);
  return out;
}

}  // namespace meshflow
