// Collective decomposition (graph/passes.h): finds the all-gathers into and reduce-scatters out
// of row products and marks the products to run them as overlapped loops.
#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"
#include "meshflow/ops/matmul.h"

namespace meshflow {

namespace {

// Returns the mesh dim j on which `from` -> `to` turns placement `was` into `becomes`, every
// other placement being the same and none after j sharding dim 0 (so that j splits the rows a
// device holds by the chunk rule); nullopt when it is not that.
std::optional<int> single_change(const Layout& from, const Layout& to, const Placement& was,
                                 const Placement& becomes) {
  if (from.mesh != to.mesh || from.shape != to.shape || from.dtype != to.dtype) return std::nullopt;
  std::optional<int> found;
  for (std::size_t i = 0; i < from.placements.size(); ++i) {
    const Placement& a = from.placements[i];
    const Placement& b = to.placements[i];
    if (a == b) {
      if (found && a == Placement::shard(0)) return std::nullopt;
      continue;
    }
    if (found || a != was || b != becomes) return std::nullopt;
    found = static_cast<int>(i);
  }
  if (found && from.mesh.shape[static_cast<std::size_t>(*found)] < 2) return std::nullopt;
  return found;
}

bool is_movement(const Node& n) {
  return n.kind == NodeKind::kMove || n.kind == NodeKind::kParallel;
}

// A row product the loops take: floating point, operand 0 of rank >= 2.
bool takes_loop(const Node& n) {
  return n.kind == NodeKind::kCompute && is_row_product(n.op.type) &&
         n.operand_layouts[0].shape.size() >= 2 &&
         (n.spec.dtype == DType::kFloat32 || n.spec.dtype == DType::kFloat64);
}

// The values a report reads: outputs, the loss and the gradients of weights.
std::vector<bool> reported(const Pcg& pcg) {
  std::vector<bool> out(pcg.nodes.size(), false);
  for (ValueId v : pcg.outputs) out[static_cast<std::size_t>(v)] = true;
  if (pcg.loss) out[static_cast<std::size_t>(*pcg.loss)] = true;
  for (const auto& [name, id] : pcg.names) {
    if (!name.starts_with("grad:")) continue;
    auto w = pcg.names.find(name.substr(5));
    if (w != pcg.names.end() &&
        pcg.nodes[static_cast<std::size_t>(w->second)].kind == NodeKind::kWeight)
      out[static_cast<std::size_t>(id)] = true;
  }
  return out;
}

std::vector<std::int64_t> block_rows(std::int64_t dim0, std::int64_t inner, int n) {
  std::vector<std::int64_t> rows;
  for (int b = 0; b < n; ++b) rows.push_back(chunk(dim0, n, b).extent * inner);
  return rows;
}

}  // namespace

OverlapCostInput overlap_cost_input(const Pcg& pcg, const Node& c, const Decomposition& d) {
  const bool gather = d.kind == Decomposition::Kind::kGatherOperand;
  const Node& a = pcg.nodes[static_cast<std::size_t>(c.inputs[0])];
  // Operand 0 as the loop reads it, and the layout whose local rows the mesh dim splits.
  const Layout& operand =
      gather ? *pcg.nodes[static_cast<std::size_t>(a.inputs[0])].layout : c.operand_layouts[0];
  const Layout& whole = gather ? *a.layout : *c.layout;
  const int n = static_cast<int>(operand.mesh.shape[static_cast<std::size_t>(d.mesh_dim)]);
  // Every device of a group has the same shapes but for dim 0's blocks: the first device's
  // local shapes stand for all.
  const DeviceId first = operand.mesh.devices.front();
  const Shape local_a = local_shape(operand, first);
  const Shape local_b = local_shape(c.operand_layouts[1], first);
  std::int64_t inner = 1;
  for (std::size_t i = 1; i + 1 < local_a.size(); ++i) inner *= local_a[i];
  const std::int64_t width_a = local_a.back(), width_out = row_product_width(c.op, local_b);
  const auto elem = static_cast<std::int64_t>(size_of(c.spec.dtype));
  OverlapCostInput in{.mesh_dim = d.mesh_dim};
  for (std::int64_t rows : block_rows(local_shape(whole, first)[0], inner, n)) {
    in.block_bytes.push_back((gather ? rows * width_a : rows * width_out) * elem);
    in.block_flops.push_back(2.0 * static_cast<double>(rows * width_a * width_out));
  }
  in.call_bytes = numel(local_b) * elem;
  return in;
}

std::vector<std::optional<Decomposition>> decomposable(const Pcg& pcg) {
  const std::size_t count = pcg.nodes.size();
  std::vector<std::optional<Decomposition>> out(count);
  // Per value: its first consumer and how many nodes read it.
  std::vector<ValueId> first(count, -1);
  std::vector<int> readers(count, 0);
  for (ValueId id = 0; id < static_cast<ValueId>(count); ++id) {
    for (ValueId v : pcg.nodes[static_cast<std::size_t>(id)].inputs) {
      auto& f = first[static_cast<std::size_t>(v)];
      if (f < 0) f = id;
      ++readers[static_cast<std::size_t>(v)];
    }
  }
  const std::vector<bool> reports = reported(pcg);
  for (ValueId id = 0; id < static_cast<ValueId>(count); ++id) {
    const Node& c = pcg.nodes[static_cast<std::size_t>(id)];
    if (!takes_loop(c)) continue;
    const ValueId a = c.inputs[0];
    const Node& move = pcg.nodes[static_cast<std::size_t>(a)];
    if (is_movement(move) && first[static_cast<std::size_t>(a)] == id &&
        std::count(c.inputs.begin(), c.inputs.end(), a) == 1) {
      const Layout& from = *pcg.nodes[static_cast<std::size_t>(move.inputs[0])].layout;
      if (auto dim =
              single_change(from, *move.layout, Placement::shard(0), Placement::replicate())) {
        out[static_cast<std::size_t>(id)] =
            Decomposition{.kind = Decomposition::Kind::kGatherOperand, .mesh_dim = *dim, .move = a};
        continue;
      }
    }
    if (readers[static_cast<std::size_t>(id)] != 1 || reports[static_cast<std::size_t>(id)])
      continue;
    const ValueId m = first[static_cast<std::size_t>(id)];
    const Node& consumer = pcg.nodes[static_cast<std::size_t>(m)];
    if (!is_movement(consumer)) continue;
    if (auto dim = single_change(*c.layout, *consumer.layout, Placement::partial(ReduceOp::kSum),
                                 Placement::shard(0))) {
      out[static_cast<std::size_t>(id)] =
          Decomposition{.kind = Decomposition::Kind::kScatterResult, .mesh_dim = *dim, .move = m};
    }
  }
  return out;
}

DecompositionChoice choose_decomposition(const Pcg& pcg, const Node& c, const Decomposition& d,
                                         const MachineModel& machine,
                                         const DecomposeOptions& options) {
  const LoopChoice loop = choose_loop(machine, overlap_cost_input(pcg, c, d),
                                      d.kind == Decomposition::Kind::kGatherOperand,
                                      options.shared_memory, options.gather_form);
  DecompositionChoice out{.decomposition = d, .estimate = loop.estimate, .pays = loop.pays};
  out.decomposition.form = loop.form;
  return out;
}

Pcg decompose_collectives(Pcg pcg, const PlanOptions& plan, const DecomposeOptions& options) {
  verify(pcg, Stage::kCopied);
  if (options.gather_form == GatherForm::kInPlace && !options.shared_memory) {
    fail(ErrorKind::kInvalidArgument,
         "gather form in_place reads peers' blocks where they lie and needs devices that share "
         "memory (the threads backend)");
  }
  const MachineModel& machine = plan.machine ? *plan.machine : default_machine();
  const std::vector<std::optional<Decomposition>> found = decomposable(pcg);
  for (std::size_t id = 0; id < found.size(); ++id) {
    if (!found[id]) continue;
    const DecompositionChoice choice =
        choose_decomposition(pcg, pcg.nodes[id], *found[id], machine, options);
    if (choice.pays || options.always) pcg.nodes[id].decomposed = choice.decomposition;
  }
  verify(pcg, Stage::kCopied);
  return pcg;
}

}  // namespace meshflow
