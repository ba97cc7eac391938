// Vocabulary-parallel expansion (graph/passes.h): each loss node whose strategy shards the classes
// becomes the steps ops/vocab_parallel.h lowers it into, laid out as the lowering chose.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "meshflow/graph/passes.h"
#include "meshflow/ops/vocab_parallel.h"

namespace meshflow {

namespace {

// The steps' names after the node's: "loss:max", "loss:stats" ("#2" and on if taken).
std::string step_name(std::set<std::string>& taken, const std::string& node, OpType type) {
  const std::string name = fmt::format("{}:{}", node, type == OpType::kLogitMax ? "max" : "stats");
  std::string candidate = name;
  for (int k = 2; taken.count(candidate); ++k) candidate = fmt::format("{}#{}", name, k);
  taken.insert(candidate);
  return candidate;
}

}  // namespace

Pcg expand_vocab_parallel(Pcg pcg, const PlanOptions& options) {
  verify(pcg, Stage::kLaidOut);
  Pcg out;
  std::vector<ValueId> remap;  // old id -> new id
  // A step already made, by (operator, new argument ids, their layouts): the gradient's
  // statistics are the forward loss's when they read the same logits and labels the same way.
  struct Made {
    OpType type;
    std::vector<ValueId> args;
    std::vector<Layout> layouts;
    ValueId id;
  };
  std::vector<Made> made;
  std::set<std::string> taken;
  for (const Node& n : pcg.nodes) taken.insert(n.name);
  for (const Node& old : pcg.nodes) {
    Node n = old;
    for (ValueId& v : n.inputs) v = remap[static_cast<std::size_t>(v)];
    if (n.replaces) n.replaces = remap[static_cast<std::size_t>(*n.replaces)];
    if (n.kind != NodeKind::kCompute || !needs_lowering(n.op, n.operand_layouts)) {
      remap.push_back(static_cast<ValueId>(out.nodes.size()));
      out.nodes.push_back(std::move(n));
      continue;
    }
    const Lowering low = lower(n.op, n.operand_layouts, options);
    std::vector<ValueId> values = n.inputs;  // the lowering's operands, then its steps
    for (std::size_t k = 0; k < low.steps.size(); ++k) {
      const LoweredStep& s = low.steps[k];
      std::vector<ValueId> args;
      for (int a : s.args) args.push_back(values[static_cast<std::size_t>(a)]);
      const bool last = k + 1 == low.steps.size();
      auto same = [&](const Made& m) {
        return m.type == s.op.type && m.args == args && m.layouts == s.strategy.inputs;
      };
      if (auto it = std::find_if(made.begin(), made.end(), same); !last && it != made.end()) {
        values.push_back(it->id);
        continue;
      }
      Node step = last ? n
                       : Node{.name = step_name(taken, old.name, s.op.type),
                              .kind = NodeKind::kCompute,
                              .phase = old.phase,
                              .spec = {s.layout.shape, s.layout.dtype},
                              .mesh = old.mesh,
                              .placements = s.layout.placements};
      step.op = s.op;
      step.inputs = args;
      step.operand_layouts = s.strategy.inputs;
      step.result_layout = s.strategy.output;
      if (!last) step.layout = s.layout;  // the last keeps the node's own (its pin, if any)
      const auto id = static_cast<ValueId>(out.nodes.size());
      out.nodes.push_back(std::move(step));
      if (!last) made.push_back({s.op.type, args, s.strategy.inputs, id});
      values.push_back(id);
    }
    remap.push_back(values.back());
  }
  carry_names(pcg, remap, out);
  verify(out, Stage::kLaidOut);
  return out;
}

}  // namespace meshflow
