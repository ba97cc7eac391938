// Transposes folded into the products that read them: a @ transpose(b) is matmul_grad_a(a, b)
// (BLAS's transpose flag on b), transpose(a) @ b with a 2-d is matmul_grad_b(a, b) (the flag
// on a). Both are operators with shape rules, sharding rules, kernels and gradients of their
// own (they are the backward pass's products), so nothing downstream changes.
#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

namespace {

// True when node `v` is a transpose of a 2-d value on `consumer`'s mesh with no placements
// pinned: what the consumer may read through BLAS's flag instead.
bool is_plain_2d_transpose(const Pcg& pcg, ValueId v, const Node& consumer) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
  if (n.kind != NodeKind::kCompute || n.op.type != OpType::kTranspose) return false;
  if (n.spec.shape.size() != 2 || n.placements || n.mesh != consumer.mesh) return false;
  return n.op.dims.empty() || n.op.dims == std::vector<int>{1, 0};
}

}  // namespace

Pcg fold_transposes(Pcg pcg) {
  const std::size_t count = pcg.nodes.size();
  // A graph already laid out or differentiated keeps its operators as they are.
  for (const Node& n : pcg.nodes)
    if (n.phase != Phase::kForward || n.layout) return pcg;
  // Fold: the product reads the transpose's operand, with the flag in its operator.
  std::vector<bool> folded_from(count, false);  // transposes a product now reads through
  bool folded = false;
  for (Node& n : pcg.nodes) {
    if (n.kind != NodeKind::kCompute || n.inputs.size() != 2) continue;
    if (n.op.type != OpType::kMatmul && n.op.type != OpType::kLinear) continue;
    const bool matrix_a = pcg.nodes[static_cast<std::size_t>(n.inputs[0])].spec.shape.size() >= 2;
    if (matrix_a && is_plain_2d_transpose(pcg, n.inputs[1], n)) {
      n.op = Op{.type = OpType::kMatmulGradA};
      folded_from[static_cast<std::size_t>(n.inputs[1])] = true;
      n.inputs[1] = pcg.nodes[static_cast<std::size_t>(n.inputs[1])].inputs[0];
      folded = true;
    } else if (is_plain_2d_transpose(pcg, n.inputs[0], n) &&
               pcg.nodes[static_cast<std::size_t>(n.inputs[1])].spec.shape.size() == 2) {
      n.op = Op{.type = OpType::kMatmulGradB};
      folded_from[static_cast<std::size_t>(n.inputs[0])] = true;
      n.inputs[0] = pcg.nodes[static_cast<std::size_t>(n.inputs[0])].inputs[0];
      folded = true;
    }
  }
  if (!folded) return pcg;
  // Drop the transposes nothing reads any more (not the loss, not an output).
  std::vector<int> readers(count, 0);
  for (const Node& n : pcg.nodes)
    for (ValueId v : n.inputs) ++readers[static_cast<std::size_t>(v)];
  if (pcg.loss) ++readers[static_cast<std::size_t>(*pcg.loss)];
  for (ValueId v : pcg.outputs) ++readers[static_cast<std::size_t>(v)];
  Pcg out;
  std::vector<ValueId> remap(count, -1);
  for (std::size_t i = 0; i < count; ++i) {
    const Node& n = pcg.nodes[i];
    if (folded_from[i] && readers[i] == 0) continue;
    remap[i] = static_cast<ValueId>(out.nodes.size());
    out.nodes.push_back(n);
    for (ValueId& v : out.nodes.back().inputs) v = remap[static_cast<std::size_t>(v)];
  }
  // Names of dropped transposes go with them.
  Pcg named{.names = pcg.names, .loss = pcg.loss, .outputs = pcg.outputs};
  std::erase_if(named.names, [&](const auto& entry) {
    return remap[static_cast<std::size_t>(entry.second)] < 0;
  });
  carry_names(named, remap, out);
  verify(out, Stage::kBuilt);
  return out;
}

}  // namespace meshflow
