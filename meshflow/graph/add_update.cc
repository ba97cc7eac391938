// The update phase (graph/passes.h): per weight with a gradient, the gradient moved into the
// weight's layout, the weight's optimizer state, and its update; once per step, the squared
// global gradient norm every update reads.
#include <fmt/format.h>

#include <optional>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

namespace {

ValueId push(Pcg& pcg, Node n) {
  pcg.nodes.push_back(std::move(n));
  return static_cast<ValueId>(pcg.nodes.size() - 1);
}

// Returns a node of `kind` in the update phase laid out as `layout`, its pins set to it.
Node laid_out(std::string name, NodeKind kind, std::vector<ValueId> inputs, TensorSpec spec,
              const Layout& layout) {
  Node n{.name = std::move(name),
         .kind = kind,
         .phase = Phase::kUpdate,
         .inputs = std::move(inputs),
         .spec = std::move(spec)};
  n.mesh = layout.mesh;
  n.placements = layout.placements;
  n.layout = layout;
  return n;
}

}  // namespace

std::optional<ValueId> find_grad_norm(const Pcg& pcg) {
  for (ValueId v = 0; v < static_cast<ValueId>(pcg.nodes.size()); ++v)
    if (pcg.nodes[static_cast<std::size_t>(v)].name == kGradNormName) return v;
  return std::nullopt;
}

Layout zero_layout(const Layout& layout) {
  std::vector<Placement> placements = layout.placements;
  std::set<int> sharded;
  for (const Placement& p : placements)
    if (p.is_shard()) sharded.insert(p.dim);
  const int rank = static_cast<int>(layout.shape.size());
  auto extent = [&](int d) { return layout.shape[static_cast<std::size_t>(d)]; };
  for (std::size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_replicate() || rank == 0) continue;
    const std::int64_t devices = layout.mesh.shape[m];
    std::optional<int> d;
    // The outermost free dim the mesh dim divides: its chunks are the fewest and longest
    // contiguous runs (on dim 0, one block of whole rows, which the reduce-scatter into it and
    // the all-gather out of it move without packing).
    for (int i = 0; i < rank && !d; ++i)
      if (!sharded.count(i) && extent(i) % devices == 0) d = i;
    // Else the largest free dim (the lower on a tie): its chunks are the most even.
    if (!d) {
      for (int i = 0; i < rank; ++i)
        if (!sharded.count(i) && (!d || extent(i) > extent(*d))) d = i;
    }
    const int dim = d.value_or(0);  // no free dim: dim 0
    placements[m] = Placement::shard(dim);
    sharded.insert(dim);
  }
  return make_layout(layout.mesh, std::move(placements), layout.shape, layout.dtype);
}

Pcg add_update(Pcg pcg, const UpdateRule& rule, int zero) {
  verify(pcg, Stage::kLaidOut);
  MESHFLOW_CHECK(zero == 0 || zero == 1 || zero == 3, "ZeRO level {}", zero);
  struct Trained {
    ValueId weight, grad;  // grad: in the update's layout once moved
    Layout update;         // the layout the update runs in: the weight's, or its ZeRO layout
  };
  std::vector<Trained> trained;
  for (ValueId w = 0; w < static_cast<ValueId>(pcg.nodes.size()); ++w) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(w)];
    if (n.kind != NodeKind::kWeight) continue;
    if (auto g = pcg.names.find("grad:" + n.name); g != pcg.names.end())
      trained.push_back({w, g->second, zero == 0 ? *n.layout : zero_layout(*n.layout)});
  }
  if (trained.empty()) return pcg;
  auto node = [&](ValueId v) -> const Node& { return pcg.nodes[static_cast<std::size_t>(v)]; };
  auto update_name = [&](ValueId w) {
    return fmt::format("{}:{}", to_string(rule.kind), node(w).name);
  };
  // Each gradient into its update's layout (a Partial one reduced: data parallelism's
  // all-reduce, or under ZeRO a reduce-scatter), named as copy insertion names a move for the
  // update that needs it. Under ZeRO-3 it runs with each micro-batch (the sharded gradient is
  // what accumulates).
  for (Trained& t : trained) {
    if (*node(t.grad).layout == t.update) continue;
    const std::string value = "grad:" + node(t.weight).name;
    Node m = laid_out(fmt::format("move:{}@{}", value, update_name(t.weight)), NodeKind::kMove,
                      {t.grad}, node(t.grad).spec, t.update);
    if (zero == 3) m.phase = Phase::kBackward;
    m.moved_value = value;
    m.consumer = update_name(t.weight);
    t.grad = push(pcg, std::move(m));
  }
  // The squared norm: each device's term on one mesh of every device holding a weight or the
  // loss, then its all-reduce.
  MESHFLOW_CHECK(pcg.loss.has_value(), "add_update without a loss");
  std::set<DeviceId> devices(node(*pcg.loss).layout->mesh.devices.begin(),
                             node(*pcg.loss).layout->mesh.devices.end());
  std::vector<ValueId> norm_inputs = {*pcg.loss};
  std::vector<Layout> norm_operands = {*node(*pcg.loss).layout};
  for (const Trained& t : trained) {
    const Layout& l = *node(t.grad).layout;
    devices.insert(l.mesh.devices.begin(), l.mesh.devices.end());
    norm_inputs.push_back(t.grad);
    norm_operands.push_back(l);
  }
  const DeviceMesh mesh =
      make_mesh({static_cast<std::int64_t>(devices.size())}, {devices.begin(), devices.end()});
  const TensorSpec scalar{.shape = {}, .dtype = DType::kFloat64};
  Node terms =
      laid_out("update:grad_norm_sq:terms", NodeKind::kGradNorm, std::move(norm_inputs), scalar,
               make_layout(mesh, {Placement::partial(ReduceOp::kSum)}, {}, scalar.dtype));
  terms.operand_layouts = std::move(norm_operands);
  const ValueId term_id = push(pcg, std::move(terms));
  const Layout reduced_layout = make_layout(mesh, {Placement::replicate()}, {}, scalar.dtype);
  Node reduced =
      laid_out(std::string(kGradNormName), NodeKind::kMove, {term_id}, scalar, reduced_layout);
  reduced.moved_value = "grad_norm_sq";
  reduced.consumer = "the updates";
  const ValueId norm = push(pcg, std::move(reduced));
  // Per weight: its state (zeros in the update's layout), then its update; under ZeRO-1 the
  // update runs on the weight's shard, which is then all-gathered back into the weight.
  for (const Trained& t : trained) {
    const Node& w = node(t.weight);
    const Layout layout = *w.layout;
    const std::string weight_name = w.name;
    const TensorSpec spec = w.spec;
    const bool sharded_update = zero == 1 && t.update != layout;
    ValueId target = t.weight;
    if (sharded_update) {  // each device's chunk of the weight: a local slice
      Node shard = laid_out(fmt::format("zero:{}", weight_name), NodeKind::kMove, {t.weight}, spec,
                            t.update);
      shard.moved_value = weight_name;
      shard.consumer = update_name(t.weight);
      target = push(pcg, std::move(shard));
    }
    std::vector<ValueId> inputs = {target, t.grad, norm};
    std::vector<Layout> operands = {t.update, t.update, reduced_layout};
    for (const std::string& s : state_names(rule)) {
      std::string name = weight_name + "." + s;
      if (pcg.names.count(name)) {
        fail(ErrorKind::kInvalidArgument,
             "tensor \"{}\" has the name of weight \"{}\"'s optimizer state: rename it", name,
             weight_name);
      }
      Node state = laid_out(name, NodeKind::kState, {}, spec, t.update);
      state.source = Source{.kind = Source::Kind::kZeros};
      const ValueId id = push(pcg, std::move(state));
      pcg.names[name] = id;
      inputs.push_back(id);
      operands.push_back(t.update);
    }
    Node u = laid_out(update_name(t.weight), NodeKind::kUpdate, std::move(inputs), spec, t.update);
    u.operand_layouts = std::move(operands);
    u.update = rule;
    const ValueId updated = push(pcg, std::move(u));
    if (sharded_update) {
      Node gather = laid_out(fmt::format("zero:{}:gather", weight_name), NodeKind::kMove, {updated},
                             spec, layout);
      gather.replaces = t.weight;
      gather.moved_value = weight_name;
      gather.consumer = "the next step";
      push(pcg, std::move(gather));
    }
  }
  verify(pcg, Stage::kLaidOut);
  return pcg;
}

}  // namespace meshflow
