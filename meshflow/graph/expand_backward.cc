// Backward expansion (graph/passes.h): walks the forward nodes from the loss back, adding for
// each the nodes that compute its operands' gradients, in the order a tape would run them.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "meshflow/core/error.h"
#include "meshflow/graph/parallel_op.h"
#include "meshflow/graph/passes.h"
#include "meshflow/ops/gradient.h"

namespace meshflow {

namespace {

struct Expander {
  Pcg& pcg;
  std::unordered_map<ValueId, ValueId> grad;  // forward value -> its gradient so far
  int count = 0;                              // makes generated names unique

  const Node& node(ValueId v) const { return pcg.nodes[static_cast<std::size_t>(v)]; }

  ValueId push(Node n, Phase phase = Phase::kBackward) {
    n.phase = phase;
    const ValueId id = static_cast<ValueId>(pcg.nodes.size());
    pcg.nodes.push_back(std::move(n));
    return id;
  }

  std::string fresh(std::string_view stem) { return fmt::format("{}#{}", stem, count++); }

  ValueId add_compute(std::string name, Op op, std::vector<ValueId> inputs, DeviceMesh mesh,
                      Phase phase = Phase::kBackward) {
    std::vector<TensorSpec> specs;
    for (ValueId v : inputs) specs.push_back(node(v).spec);
    Node n{
        .name = std::move(name), .kind = NodeKind::kCompute, .inputs = std::move(inputs), .op = op};
    n.spec = infer(op, specs);
    n.mesh = std::move(mesh);
    return push(std::move(n), phase);
  }

  ValueId add_move(std::string name, ValueId value, DeviceMesh mesh,
                   std::optional<std::vector<Placement>> placements, std::string consumer) {
    Node n{.name = std::move(name),
           .kind = NodeKind::kMove,
           .inputs = {value},
           .spec = node(value).spec};
    n.mesh = std::move(mesh);
    n.placements = std::move(placements);
    n.moved_value = node(value).name;
    n.consumer = std::move(consumer);
    return push(std::move(n));
  }

  // Adds `contribution` to the gradient of forward value x, moving it to x's mesh first.
  void contribute(ValueId x, ValueId contribution) {
    const DeviceMesh mesh = *node(x).mesh;  // a copy: pushing nodes moves them
    if (*node(contribution).mesh != mesh) {
      contribution = add_move(fresh("bwd:" + node(x).name + "/to-mesh"), contribution, mesh,
                              std::nullopt, node(x).name);
    }
    auto it = grad.find(x);
    if (it == grad.end()) {
      grad[x] = contribution;
      return;
    }
    it->second = add_compute(fresh("bwd:" + node(x).name + "/sum"), Op{.type = OpType::kAdd},
                             {it->second, contribution}, mesh);
    prefer_layout_of(x, it->second);
  }

  // Lets layout inference steer gradient `g` toward forward value x's layout (Partial read as
  // Replicate: every term of a sum receives the whole gradient), when g is computed on x's mesh.
  void prefer_layout_of(ValueId x, ValueId g) {
    Node& n = pcg.nodes[static_cast<std::size_t>(g)];
    const Layout& l = *node(x).layout;
    if (n.kind == NodeKind::kCompute && !n.prefer && *n.mesh == l.mesh)
      n.prefer = gradient_placements(l);
  }

  // Forward node id's gradient program, and which of its steps some needed operand gradient
  // reads, transitively.
  std::pair<GradProgram, std::vector<bool>> program_of(ValueId id,
                                                       const std::vector<bool>& needs) const {
    const Node& n = node(id);
    std::vector<TensorSpec> specs;
    for (ValueId v : n.inputs) specs.push_back(node(v).spec);
    GradProgram program = gradient_program(n.op, specs);
    std::vector<bool> used(program.steps.size(), false);
    std::vector<int> stack;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const auto& g_ref = program.input_grads[i];
      if (needs[static_cast<std::size_t>(n.inputs[i])] && g_ref &&
          g_ref->kind == GradRef::Kind::kStep)
        stack.push_back(g_ref->index);
    }
    while (!stack.empty()) {
      const int s = stack.back();
      stack.pop_back();
      if (used[static_cast<std::size_t>(s)]) continue;
      used[static_cast<std::size_t>(s)] = true;
      for (const GradRef& r : program.steps[static_cast<std::size_t>(s)].args)
        if (r.kind == GradRef::Kind::kStep) stack.push_back(r.index);
    }
    return {std::move(program), std::move(used)};
  }

  // The used steps of forward node id's gradient program that read its operands alone, made
  // now in the forward phase ("<node>:<operator>"), keyed by (node, step).
  std::map<std::pair<ValueId, std::size_t>, ValueId> forward_steps;

  void add_forward_steps(ValueId id, const std::vector<bool>& needs) {
    const auto [program, used] = program_of(id, needs);
    for (std::size_t s = 0; s < program.steps.size(); ++s) {
      const GradStep& step = program.steps[s];
      if (!used[s] || !std::all_of(step.args.begin(), step.args.end(), [](const GradRef& r) {
            return r.kind == GradRef::Kind::kInput;
          }))
        continue;
      const Node& n = node(id);
      std::vector<ValueId> args;
      for (const GradRef& r : step.args)
        args.push_back(n.inputs[static_cast<std::size_t>(r.index)]);
      const DeviceMesh mesh = *n.mesh;
      forward_steps[{id, s}] = add_compute(fmt::format("{}:{}", n.name, to_string(step.op.type)),
                                           step.op, std::move(args), mesh, Phase::kForward);
    }
  }

  void backward_compute(ValueId id, ValueId g, const std::vector<bool>& needs) {
    const auto [program, used] = program_of(id, needs);
    const Node& n = node(id);
    const std::string forward_name = n.name;
    const std::vector<ValueId> operands = n.inputs;
    const DeviceMesh mesh = *n.mesh;
    std::vector<ValueId> steps(program.steps.size(), -1);
    auto value = [&](const GradRef& r) {
      switch (r.kind) {
        case GradRef::Kind::kInput:
          return operands[static_cast<std::size_t>(r.index)];
        case GradRef::Kind::kOutput:
          return id;
        case GradRef::Kind::kGrad:
          return g;
        case GradRef::Kind::kStep:
          break;
      }
      return steps[static_cast<std::size_t>(r.index)];
    };
    for (std::size_t s = 0; s < program.steps.size(); ++s) {
      if (!used[s]) continue;
      if (const auto made = forward_steps.find({id, s}); made != forward_steps.end()) {
        steps[s] = made->second;
        continue;
      }
      std::vector<ValueId> args;
      for (const GradRef& r : program.steps[s].args) args.push_back(value(r));
      steps[s] = add_compute(fmt::format("bwd:{}/{}", forward_name, s), program.steps[s].op,
                             std::move(args), mesh);
    }
    for (std::size_t i = 0; i < operands.size(); ++i) {
      if (!needs[static_cast<std::size_t>(operands[i])] || !program.input_grads[i]) continue;
      // A step made here for this operand (not the incoming gradient passed through).
      if (program.input_grads[i]->kind == GradRef::Kind::kStep)
        prefer_layout_of(operands[i], value(*program.input_grads[i]));
      contribute(operands[i], value(*program.input_grads[i]));
    }
  }

  void backward_parallel(ValueId id, ValueId g) {
    const Node& n = node(id);
    const ValueId x = n.inputs[0];
    const Layout& in = *node(x).layout;
    const ValueId moved =
        add_move(fmt::format("bwd:{}", n.name), g, in.mesh, gradient_placements(in), n.name);
    contribute(x, moved);
  }
};

}  // namespace

Pcg expand_backward(Pcg pcg) {
  verify(pcg, Stage::kLaidOut);
  for (const Node& n : pcg.nodes) MESHFLOW_CHECK(n.phase == Phase::kForward, "{}", n.name);
  if (!pcg.loss) fail(ErrorKind::kInvalidArgument, "the model names no \"loss\" to train");
  const auto forward_count = static_cast<ValueId>(pcg.nodes.size());
  // needs[v]: some weight's gradient flows through v.
  std::vector<bool> needs(pcg.nodes.size(), false);
  for (ValueId v = 0; v < forward_count; ++v) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
    needs[static_cast<std::size_t>(v)] = n.kind == NodeKind::kWeight;
    for (ValueId in : n.inputs)
      if (needs[static_cast<std::size_t>(in)]) needs[static_cast<std::size_t>(v)] = true;
  }
  Expander e{pcg};
  const ValueId loss = *pcg.loss;
  // Which forward nodes receive a gradient (as the walk below finds them), so that the steps of
  // theirs that read only their operands are made first, in the forward phase.
  std::vector<bool> reached(pcg.nodes.size(), false);
  reached[static_cast<std::size_t>(loss)] = true;
  for (ValueId v = forward_count - 1; v >= 0; --v) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
    if (!reached[static_cast<std::size_t>(v)] || !needs[static_cast<std::size_t>(v)]) continue;
    if (n.kind == NodeKind::kParallel) reached[static_cast<std::size_t>(n.inputs[0])] = true;
    if (n.kind != NodeKind::kCompute) continue;
    const GradProgram program = e.program_of(v, needs).first;
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (needs[static_cast<std::size_t>(n.inputs[i])] && program.input_grads[i])
        reached[static_cast<std::size_t>(n.inputs[i])] = true;
  }
  for (ValueId v = 0; v < forward_count; ++v)
    if (reached[static_cast<std::size_t>(v)] && needs[static_cast<std::size_t>(v)] &&
        pcg.nodes[static_cast<std::size_t>(v)].kind == NodeKind::kCompute)
      e.add_forward_steps(v, needs);
  {
    const Node& l = pcg.nodes[static_cast<std::size_t>(loss)];
    Node seed{.name = "grad:" + l.name,
              .kind = NodeKind::kInput,
              .spec = l.spec,
              .source = Source{.kind = Source::Kind::kFill, .a = 1.0}};
    seed.mesh = l.layout->mesh;
    seed.placements = gradient_placements(*l.layout);
    e.grad[loss] = e.push(std::move(seed));
  }
  for (ValueId v = forward_count - 1; v >= 0; --v) {
    auto it = e.grad.find(v);
    if (it == e.grad.end() || !needs[static_cast<std::size_t>(v)]) continue;
    const ValueId g = it->second;
    pcg.names["grad:" + pcg.nodes[static_cast<std::size_t>(v)].name] = g;
    switch (pcg.nodes[static_cast<std::size_t>(v)].kind) {
      case NodeKind::kCompute:
        e.backward_compute(v, g, needs);
        break;
      case NodeKind::kParallel:
        e.backward_parallel(v, g);
        break;
      default:
        break;
    }
  }
  verify(pcg, Stage::kBuilt);
  return pcg;
}

}  // namespace meshflow
