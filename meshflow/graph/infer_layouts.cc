// Layout inference (graph/passes.h): fills `layout` (and a compute node's operand and result
// layouts) of every node that has none, in topological order.
#include <fmt/format.h>

#include "meshflow/core/error.h"
#include "meshflow/graph/parallel_op.h"
#include "meshflow/graph/passes.h"
#include "meshflow/ops/strategy.h"

namespace meshflow {

namespace {

void lay_out_compute(const Pcg& pcg, Node& n, StrategyCache& cache) {
  const DeviceMesh& mesh = *n.mesh;
  std::vector<Layout> seen;  // the inputs as they arrive on the node's mesh
  for (ValueId v : n.inputs) {
    const Layout& l = *pcg.nodes[static_cast<std::size_t>(v)].layout;
    seen.push_back(l.mesh == mesh ? l : make_layout(mesh, l.placements, l.shape, l.dtype));
  }
  std::shared_ptr<const Strategy> s;
  try {
    // A pin's move, or a preference's, is part of a strategy's price.
    std::optional<ResultTarget> target;
    if (n.placements) target = ResultTarget{.placements = *n.placements};
    if (!n.placements && n.prefer)
      target = ResultTarget{.placements = *n.prefer, .keep_partial = true};
    s = cache.get(n.op, seen, target);
  } catch (const Error& e) {
    fail(e.kind(), "node \"{}\": {}", n.name, e.what());
  }
  n.operand_layouts = s->inputs;
  n.result_layout = s->output;
  n.layout =
      n.placements ? make_layout(mesh, *n.placements, n.spec.shape, n.spec.dtype) : s->output;
}

}  // namespace

Pcg infer_layouts(Pcg pcg, const PlanOptions& options) {
  verify(pcg, Stage::kBuilt);
  StrategyCache cache(options);
  for (Node& n : pcg.nodes) {
    if (n.layout) continue;
    const Layout* input =
        n.inputs.empty() ? nullptr : &*pcg.nodes[static_cast<std::size_t>(n.inputs[0])].layout;
    switch (n.kind) {
      case NodeKind::kInput:
      case NodeKind::kWeight:
      case NodeKind::kState:
        n.layout = pinned_layout(n, nullptr);
        break;
      case NodeKind::kParallel:
        n.layout = pinned_layout(n, input);
        check_parallel_op(n, *input, *n.layout);
        break;
      case NodeKind::kMove:
        n.layout = pinned_layout(n, input);
        break;
      case NodeKind::kCompute:
        lay_out_compute(pcg, n, cache);
        break;
      case NodeKind::kGradNorm:
      case NodeKind::kUpdate:
        MESHFLOW_CHECK(
            false, "node \"{}\" reached layout inference unlaid (add_update lays it out)", n.name);
        break;
    }
  }
  verify(pcg, Stage::kLaidOut);
  return pcg;
}

}  // namespace meshflow
