// The update phase (graph/passes.h): one SGD node per weight that has a gradient.
#include "meshflow/graph/passes.h"

namespace meshflow {

Pcg add_update(Pcg pcg) {
  verify(pcg, Stage::kBuilt);
  const auto count = static_cast<ValueId>(pcg.nodes.size());
  for (ValueId w = 0; w < count; ++w) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(w)];
    if (n.kind != NodeKind::kWeight) continue;
    auto g = pcg.names.find("grad:" + n.name);
    if (g == pcg.names.end()) continue;
    Node u{.name = "sgd:" + n.name,
           .kind = NodeKind::kUpdate,
           .phase = Phase::kUpdate,
           .inputs = {w, g->second},
           .spec = n.spec};
    u.mesh = n.mesh;
    pcg.nodes.push_back(std::move(u));
  }
  verify(pcg, Stage::kBuilt);
  return pcg;
}

}  // namespace meshflow
