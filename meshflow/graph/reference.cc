// The whole-tensor, one-device interpreter of a built graph.
#include "meshflow/graph/reference.h"

#include "meshflow/core/error.h"
#include "meshflow/graph/source.h"
#include "meshflow/ops/elementwise.h"
#include "meshflow/ops/gradient.h"

namespace meshflow {

ReferenceModel reference_load(const Pcg& pcg) {
  ReferenceModel m{.pcg = &pcg};
  m.values.resize(pcg.nodes.size());
  for (std::size_t i = 0; i < pcg.nodes.size(); ++i) {
    const Node& n = pcg.nodes[i];
    if (n.kind == NodeKind::kInput || n.kind == NodeKind::kWeight) m.values[i] = load_global(n);
  }
  return m;
}

void reference_forward(ReferenceModel& model) {
  const Pcg& pcg = *model.pcg;
  for (std::size_t i = 0; i < pcg.nodes.size(); ++i) {
    const Node& n = pcg.nodes[i];
    if (n.phase != Phase::kForward) continue;
    std::vector<const Tensor*> args;
    for (ValueId v : n.inputs) args.push_back(&model.values[static_cast<std::size_t>(v)]);
    switch (n.kind) {
      case NodeKind::kCompute:
        model.values[i] = compute(n.op, args);
        break;
      case NodeKind::kParallel:
      case NodeKind::kMove:
        model.values[i] = args[0]->clone();
        break;
      default:
        break;
    }
  }
}

std::map<std::string, Tensor> reference_gradients(const ReferenceModel& model) {
  const Pcg& pcg = *model.pcg;
  MESHFLOW_CHECK(pcg.loss.has_value());
  std::vector<std::optional<Tensor>> grad(pcg.nodes.size());
  {
    Tensor one(pcg.nodes[static_cast<std::size_t>(*pcg.loss)].spec.dtype, Shape{});
    visit_dtype(one.dtype(), [&](auto zero) { one.data<decltype(zero)>()[0] = 1; });
    grad[static_cast<std::size_t>(*pcg.loss)] = std::move(one);
  }
  auto accumulate = [&](ValueId x, Tensor g) {
    auto& slot = grad[static_cast<std::size_t>(x)];
    if (slot) {
      slot = compute(Op{.type = OpType::kAdd}, {&*slot, &g});
    } else {
      slot = std::move(g);
    }
  };
  for (std::size_t i = pcg.nodes.size(); i-- > 0;) {
    const Node& n = pcg.nodes[i];
    if (!grad[i] || n.phase != Phase::kForward) continue;
    if (n.kind == NodeKind::kParallel || n.kind == NodeKind::kMove) {
      accumulate(n.inputs[0], grad[i]->clone());
    } else if (n.kind == NodeKind::kCompute) {
      std::vector<const Tensor*> args;
      for (ValueId v : n.inputs) args.push_back(&model.values[static_cast<std::size_t>(v)]);
      auto gs = compute_backward(n.op, args, model.values[i], *grad[i]);
      for (std::size_t k = 0; k < gs.size(); ++k)
        if (gs[k]) accumulate(n.inputs[k], std::move(*gs[k]));
    }
  }
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < pcg.nodes.size(); ++i) {
    if (pcg.nodes[i].kind == NodeKind::kWeight && grad[i])
      out[pcg.nodes[i].name] = std::move(*grad[i]);
  }
  return out;
}

}  // namespace meshflow
