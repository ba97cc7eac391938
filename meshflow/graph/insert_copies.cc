// Copy insertion (graph/passes.h): rebuilds the node list with a move before each operand that
// is not in the layout its consumer needs, and after each compute node whose pin differs from
// its kernel's layout.
#include <fmt/format.h>

#include <map>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

namespace {

struct Copier {
  Pcg out;
  std::vector<ValueId> remap;  // old id -> new id (its value as consumers see it)
  std::map<std::pair<ValueId, std::size_t>, ValueId> moved;  // (new id, layout hash) -> move
  std::set<std::string> taken;
  std::map<ValueId, std::string> shown;  // new id -> the name a user knows the value by

  std::string unique(std::string name) {
    std::string candidate = name;
    for (int k = 2; taken.count(candidate); ++k) candidate = fmt::format("{}#{}", name, k);
    taken.insert(candidate);
    return candidate;
  }

  ValueId push(Node n) {
    const auto id = static_cast<ValueId>(out.nodes.size());
    out.nodes.push_back(std::move(n));
    return id;
  }

  // Returns value v (a new id) in `layout`, moved there for `consumer` if it is not.
  ValueId in_layout(ValueId v, const Layout& layout, const std::string& consumer, Phase phase) {
    const Node& src = out.nodes[static_cast<std::size_t>(v)];
    if (*src.layout == layout) return v;
    const auto key = std::make_pair(v, hash_value(layout));
    auto it = moved.find(key);
    if (it != moved.end() && *out.nodes[static_cast<std::size_t>(it->second)].layout == layout)
      return it->second;
    auto known = shown.find(v);
    const std::string value = known == shown.end() ? src.name : known->second;
    Node m{.name = unique(fmt::format("move:{}@{}", value, consumer)),
           .kind = NodeKind::kMove,
           .phase = phase,
           .inputs = {v},
           .spec = src.spec};
    m.mesh = layout.mesh;
    m.placements = layout.placements;
    m.moved_value = value;
    m.consumer = consumer;
    m.layout = layout;
    const ValueId id = push(std::move(m));
    moved[key] = id;
    return id;
  }
};

}  // namespace

Pcg insert_copies(Pcg pcg) {
  verify(pcg, Stage::kLaidOut);
  Copier c;
  for (const Node& n : pcg.nodes) c.taken.insert(n.name);
  // Old id -> user name ("grad:w" over a generated node name); applied as ids are remapped.
  std::map<ValueId, std::string> user_name;
  for (const auto& [name, id] : pcg.names) {
    auto [it, fresh] = user_name.try_emplace(id, name);
    if (!fresh && name.starts_with("grad:") && !it->second.starts_with("grad:")) it->second = name;
  }
  c.out.loss = std::nullopt;
  for (const Node& old : pcg.nodes) {
    Node n = old;
    if (n.replaces) n.replaces = c.remap[static_cast<std::size_t>(*n.replaces)];
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = c.remap[static_cast<std::size_t>(n.inputs[i])];
      const bool needs = n.kind == NodeKind::kCompute || n.kind == NodeKind::kUpdate ||
                         n.kind == NodeKind::kGradNorm;
      n.inputs[i] = needs ? c.in_layout(v, n.operand_layouts[i], old.name, old.phase) : v;
    }
    if (n.kind == NodeKind::kCompute && *n.result_layout != *n.layout) {
      // The kernel writes its own layout; the pin is a move of that.
      Node kernel = n;
      kernel.name = c.unique(old.name + ":kernel");
      kernel.layout = n.result_layout;
      kernel.placements = std::nullopt;
      kernel.checkpoint = false;  // the mark is the pinned value's
      const ValueId k = c.push(std::move(kernel));
      Node m{.name = old.name,
             .kind = NodeKind::kMove,
             .phase = old.phase,
             .inputs = {k},
             .spec = old.spec};
      m.mesh = old.layout->mesh;
      m.placements = old.layout->placements;
      m.moved_value = old.name;
      m.consumer = old.name + " (its pin)";
      m.layout = old.layout;
      m.checkpoint = old.checkpoint;
      c.remap.push_back(c.push(std::move(m)));
      continue;
    }
    c.remap.push_back(c.push(std::move(n)));
    auto known = user_name.find(static_cast<ValueId>(c.remap.size() - 1));
    if (known != user_name.end()) c.shown[c.remap.back()] = known->second;
  }
  carry_names(pcg, c.remap, c.out);
  verify(c.out, Stage::kCopied);
  return std::move(c.out);
}

}  // namespace meshflow
