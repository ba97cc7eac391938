// The PCG builder, text form and verifier.
#include "meshflow/graph/pcg.h"

#include <fmt/format.h>

#include <set>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"
#include "meshflow/ops/vocab_parallel.h"

namespace meshflow {

std::string_view to_string(ParallelType type) {
  switch (type) {
    case ParallelType::kRepartition:
      return "repartition";
    case ParallelType::kCombine:
      return "combine";
    case ParallelType::kReplicate:
      return "replicate";
    case ParallelType::kReduction:
      return "reduction";
  }
  return "?";
}

std::optional<ParallelType> parse_parallel_type(std::string_view name) {
  for (ParallelType t : {ParallelType::kRepartition, ParallelType::kCombine,
                         ParallelType::kReplicate, ParallelType::kReduction}) {
    if (to_string(t) == name) return t;
  }
  return std::nullopt;
}

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kUpdate:
      return "update";
  }
  return "?";
}

ValueId find_value(const Pcg& pcg, const std::string& name) {
  auto it = pcg.names.find(name);
  if (it == pcg.names.end()) fail(ErrorKind::kInvalidArgument, "no value is named \"{}\"", name);
  return it->second;
}

namespace {

std::string spec_text(const TensorSpec& spec) {
  return fmt::format("{} {}", to_string(spec.dtype), to_string(spec.shape));
}

std::string what_text(const Pcg& pcg, const Node& n) {
  std::string args;
  for (ValueId v : n.inputs) {
    if (!args.empty()) args += ", ";
    args += pcg.nodes[static_cast<std::size_t>(v)].name;
  }
  switch (n.kind) {
    case NodeKind::kInput:
      return "input";
    case NodeKind::kWeight:
      return "weight";
    case NodeKind::kCompute:
      return fmt::format("{}({})", to_string(n.op), args);
    case NodeKind::kParallel: {
      const bool has_dim = n.parallel.type == ParallelType::kRepartition ||
                           n.parallel.type == ParallelType::kCombine;
      const std::string dim = has_dim ? fmt::format("dim={}, ", n.parallel.dim) : std::string();
      return fmt::format("{}({}degree={})({})", to_string(n.parallel.type), dim, n.parallel.degree,
                         args);
    }
    case NodeKind::kMove:
      if (n.replaces)
        return fmt::format("move({}) replacing {}", args,
                           pcg.nodes[static_cast<std::size_t>(*n.replaces)].name);
      return fmt::format("move({})", args);
    case NodeKind::kState:
      return "state";
    case NodeKind::kGradNorm:
      return fmt::format("grad_norm_sq({})", args);
    case NodeKind::kUpdate:
      return fmt::format("{}({})", to_string(n.update.kind), args);
  }
  return "?";
}

// A node's mesh as the builder resolves it: its pin, else its first input's.
const DeviceMesh& node_mesh(const Pcg& pcg, const Node& n) {
  if (n.mesh) return *n.mesh;
  MESHFLOW_CHECK(!n.inputs.empty(), "node \"{}\" has neither a mesh nor inputs", n.name);
  return node_mesh(pcg, pcg.nodes[static_cast<std::size_t>(n.inputs.front())]);
}

void check_new_name(const Pcg& pcg, const std::string& name) {
  if (name.empty()) fail(ErrorKind::kInvalidArgument, "a node has an empty name");
  if (name.find(':') != std::string::npos) {
    fail(ErrorKind::kInvalidArgument,
         "name \"{}\" contains ':' (reserved for names meshflow makes, e.g. \"grad:w\")", name);
  }
  // `--save DIR` writes a value as the folder DIR/<name>.
  if (name.find('/') != std::string::npos || name == "." || name == "..") {
    fail(ErrorKind::kInvalidArgument, "name \"{}\" cannot name a folder: use no '/', '.' or '..'",
         name);
  }
  if (pcg.names.count(name))
    fail(ErrorKind::kInvalidArgument, "name \"{}\" is given to two values", name);
}

void check_input(const Pcg& pcg, const std::string& node, ValueId v) {
  if (v < 0 || v >= static_cast<ValueId>(pcg.nodes.size()))
    fail(ErrorKind::kInvalidArgument, "node \"{}\": input {} is not a value of the graph", node, v);
}

ValueId push(Pcg& pcg, Node node) {
  const ValueId id = static_cast<ValueId>(pcg.nodes.size());
  pcg.names[node.name] = id;
  pcg.nodes.push_back(std::move(node));
  return id;
}

ValueId add_source(Pcg& pcg, NodeKind kind, std::string name, TensorSpec spec, DeviceMesh mesh,
                   std::vector<Placement> placements, Source source) {
  check_new_name(pcg, name);
  try {
    make_layout(mesh, placements, spec.shape, spec.dtype);
  } catch (const Error& e) {
    fail(e.kind(), "tensor \"{}\": {}", name, e.what());
  }
  if (kind == NodeKind::kWeight && !is_floating(spec.dtype)) {
    fail(ErrorKind::kInvalidArgument, "weight \"{}\" has dtype {}: weights are float32 or float64",
         name, to_string(spec.dtype));
  }
  Node n{.name = std::move(name), .kind = kind, .spec = std::move(spec), .source = source};
  n.mesh = std::move(mesh);
  n.placements = std::move(placements);
  return push(pcg, std::move(n));
}

}  // namespace

ValueId add_input(Pcg& pcg, std::string name, TensorSpec spec, DeviceMesh mesh,
                  std::vector<Placement> placements, Source source) {
  return add_source(pcg, NodeKind::kInput, std::move(name), std::move(spec), std::move(mesh),
                    std::move(placements), std::move(source));
}

ValueId add_weight(Pcg& pcg, std::string name, TensorSpec spec, DeviceMesh mesh,
                   std::vector<Placement> placements, Source source) {
  return add_source(pcg, NodeKind::kWeight, std::move(name), std::move(spec), std::move(mesh),
                    std::move(placements), std::move(source));
}

ValueId add_compute(Pcg& pcg, std::string name, Op op, std::vector<ValueId> inputs,
                    std::optional<DeviceMesh> mesh,
                    std::optional<std::vector<Placement>> placements) {
  check_new_name(pcg, name);
  if (inputs.empty()) fail(ErrorKind::kInvalidArgument, "node \"{}\" has no inputs", name);
  std::vector<TensorSpec> specs;
  for (ValueId v : inputs) {
    check_input(pcg, name, v);
    specs.push_back(pcg.nodes[static_cast<std::size_t>(v)].spec);
  }
  Node n{.name = name, .kind = NodeKind::kCompute, .inputs = inputs, .op = op};
  try {
    n.spec = infer(op, specs);
  } catch (const Error& e) {
    fail(e.kind(), "node \"{}\": {}", name, e.what());
  }
  n.mesh = mesh ? *mesh : node_mesh(pcg, pcg.nodes[static_cast<std::size_t>(inputs.front())]);
  for (ValueId v : inputs) {
    const Node& in = pcg.nodes[static_cast<std::size_t>(v)];
    const DeviceMesh& m = node_mesh(pcg, in);
    if (m.shape != n.mesh->shape) {
      fail(ErrorKind::kInvalidArgument,
           "node \"{}\" runs on mesh {} but its input \"{}\" lives on mesh {}: an input is moved "
           "to its consumer's mesh keeping its placements, so the meshes must have one shape",
           name, to_string(*n.mesh), in.name, to_string(m));
    }
  }
  if (placements) {
    try {
      make_layout(*n.mesh, *placements, n.spec.shape, n.spec.dtype);
    } catch (const Error& e) {
      fail(e.kind(), "node \"{}\": {}", name, e.what());
    }
    n.placements = std::move(placements);
  }
  return push(pcg, std::move(n));
}

ValueId add_parallel(Pcg& pcg, std::string name, ParallelOp parallel, ValueId input,
                     std::optional<DeviceMesh> mesh, std::vector<Placement> placements) {
  check_new_name(pcg, name);
  check_input(pcg, name, input);
  const Node& in = pcg.nodes[static_cast<std::size_t>(input)];
  if (parallel.degree < 1)
    fail(ErrorKind::kInvalidArgument, "node \"{}\": degree {} must be at least 1", name,
         parallel.degree);
  const int rank = static_cast<int>(in.spec.shape.size());
  if (parallel.type == ParallelType::kRepartition || parallel.type == ParallelType::kCombine) {
    if (parallel.dim < -rank || parallel.dim >= rank) {
      fail(ErrorKind::kInvalidArgument, "node \"{}\": dim {} is out of range for \"{}\" of {} dims",
           name, parallel.dim, in.name, rank);
    }
    if (parallel.dim < 0) parallel.dim += rank;
  }
  Node n{.name = name,
         .kind = NodeKind::kParallel,
         .inputs = {input},
         .spec = in.spec,
         .parallel = parallel};
  n.mesh = mesh ? *mesh : node_mesh(pcg, in);
  try {
    make_layout(*n.mesh, placements, n.spec.shape, n.spec.dtype);
  } catch (const Error& e) {
    fail(e.kind(), "node \"{}\": {}", name, e.what());
  }
  n.placements = std::move(placements);
  return push(pcg, std::move(n));
}

void set_loss(Pcg& pcg, ValueId loss) {
  check_input(pcg, "loss", loss);
  const Node& n = pcg.nodes[static_cast<std::size_t>(loss)];
  if (!n.spec.shape.empty() || !is_floating(n.spec.dtype)) {
    fail(ErrorKind::kInvalidArgument,
         "the loss \"{}\" is {}: a loss must be a floating-point scalar", n.name,
         spec_text(n.spec));
  }
  pcg.loss = loss;
}

void add_output(Pcg& pcg, ValueId value) {
  check_input(pcg, "outputs", value);
  pcg.outputs.push_back(value);
}

Layout pinned_layout(const Node& n, const Layout* input) {
  MESHFLOW_CHECK(n.placements.has_value() || input != nullptr, "node \"{}\" has no pin", n.name);
  DeviceMesh mesh = n.mesh ? *n.mesh : input->mesh;
  std::vector<Placement> placements = n.placements ? *n.placements : input->placements;
  return make_layout(std::move(mesh), std::move(placements), n.spec.shape, n.spec.dtype);
}

std::string to_text(const Pcg& pcg) {
  std::string out;
  for (const Node& n : pcg.nodes) {
    out += fmt::format("{} = {}  [{}]", n.name, what_text(pcg, n), to_string(n.phase));
    if (n.layout) {
      out += fmt::format("  {} {}", to_string(n.layout->mesh), to_string(n.layout->placements));
    } else if (n.placements) {
      out += fmt::format("  pin {}", to_string(*n.placements));
    }
    out += fmt::format("  {}", spec_text(n.spec));
    if (!n.operand_layouts.empty()) {
      std::string ops;
      for (const Layout& l : n.operand_layouts) {
        if (!ops.empty()) ops += " + ";
        ops += to_string(l.placements);
      }
      out += fmt::format("  needs {}", ops);
    }
    if (n.checkpoint) out += "  checkpoint";
    if (const auto& d = n.decomposed) {
      const bool gather = d->kind == Decomposition::Kind::kGatherOperand;
      out += fmt::format("  overlaps {} of {} on mesh dim {}{}",
                         gather ? "all_gather" : "reduce_scatter",
                         pcg.nodes[static_cast<std::size_t>(d->move)].name, d->mesh_dim,
                         gather ? fmt::format(" ({})", to_string(d->form)) : "");
    }
    out += "\n";
  }
  if (pcg.loss) out += fmt::format("loss: {}\n", pcg.nodes[*pcg.loss].name);
  if (!pcg.outputs.empty()) {
    std::string names;
    for (ValueId v : pcg.outputs) names += (names.empty() ? "" : ", ") + pcg.nodes[v].name;
    out += fmt::format("outputs: {}\n", names);
  }
  return out;
}

namespace {

void verify_node(const Pcg& pcg, ValueId id, Stage stage) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(id)];
  auto check = [&](bool ok, std::string_view what) {
    MESHFLOW_CHECK(ok, "graph invariant broken at node \"{}\": {}", n.name, what);
  };
  for (ValueId v : n.inputs) check(v >= 0 && v < id, "an input is not an earlier node");
  auto input = [&](std::size_t i) -> const Node& { return pcg.nodes[n.inputs[i]]; };
  switch (n.kind) {
    case NodeKind::kInput:
    case NodeKind::kWeight:
    case NodeKind::kState:
      check(n.inputs.empty() && n.mesh && n.placements, "a source has inputs or lacks its pin");
      break;
    case NodeKind::kGradNorm:
      check(!n.inputs.empty() && n.spec == TensorSpec{.shape = {}, .dtype = DType::kFloat64},
            "a gradient norm is not a float64 scalar of the loss and the gradients");
      break;
    case NodeKind::kCompute: {
      std::vector<TensorSpec> specs;
      for (ValueId v : n.inputs) specs.push_back(pcg.nodes[v].spec);
      check(!n.inputs.empty() && infer(n.op, specs) == n.spec, "spec differs from the op's rule");
      break;
    }
    case NodeKind::kParallel:
    case NodeKind::kMove:
      check(n.inputs.size() == 1 && input(0).spec == n.spec, "a movement changes the spec");
      if (n.replaces) {
        const Node& w = pcg.nodes[static_cast<std::size_t>(*n.replaces)];
        check(*n.replaces >= 0 && *n.replaces < id && w.kind == NodeKind::kWeight &&
                  w.spec == n.spec && input(0).kind == NodeKind::kUpdate,
              "a move replacing a weight is not an updated shard of it");
        if (stage != Stage::kBuilt) check(w.layout == n.layout, "it replaces a weight's layout");
      }
      break;
    case NodeKind::kUpdate: {
      const std::size_t states = state_names(n.update).size();
      // The weight, or at ZeRO-1 its shard in the ZeRO layout (a move of it).
      const bool weight = input(0).kind == NodeKind::kWeight ||
                          (input(0).kind == NodeKind::kMove &&
                           pcg.nodes[input(0).inputs[0]].kind == NodeKind::kWeight);
      bool ok = n.inputs.size() == 3 + states && weight && input(0).spec == n.spec &&
                input(1).spec == n.spec &&
                input(2).spec == TensorSpec{.shape = {}, .dtype = DType::kFloat64};
      for (std::size_t i = 3; ok && i < n.inputs.size(); ++i)
        ok = input(i).kind == NodeKind::kState && input(i).spec == n.spec;
      check(ok, "an update is not (weight, gradient, squared norm, state of its spec...)");
      break;
    }
  }
  if (n.recomputes) {
    const ValueId o = *n.recomputes;
    const Node* original = o >= 0 && o < id ? &pcg.nodes[static_cast<std::size_t>(o)] : nullptr;
    check(original && original->phase == Phase::kForward && n.phase == Phase::kBackward &&
              original->kind == n.kind && original->op == n.op && original->spec == n.spec &&
              original->layout == n.layout && original->inputs.size() == n.inputs.size(),
          "a recomputation is not a backward copy of an earlier forward node");
  }
  if (stage == Stage::kBuilt) return;
  check(n.layout.has_value(), "no layout");
  check(n.layout->shape == n.spec.shape && n.layout->dtype == n.spec.dtype,
        "layout's shape or dtype differs from the spec");
  if (n.mesh) check(n.layout->mesh == *n.mesh, "layout's mesh differs from the pin");
  const bool pins_result = n.kind != NodeKind::kCompute;
  if (pins_result && n.placements)
    check(n.layout->placements == *n.placements, "layout differs from the pin");
  const bool needs_operands =
      n.kind == NodeKind::kCompute || n.kind == NodeKind::kUpdate || n.kind == NodeKind::kGradNorm;
  if (needs_operands) {
    check(n.operand_layouts.size() == n.inputs.size(), "operand layouts missing");
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      check(n.operand_layouts[i].shape == input(i).spec.shape, "an operand layout's shape");
      if (stage == Stage::kCopied)
        check(*input(i).layout == n.operand_layouts[i], "an operand is not in the needed layout");
    }
  }
  if (stage == Stage::kCopied && n.kind == NodeKind::kCompute && n.placements)
    check(n.layout->placements == *n.placements, "a pinned result is not in its pin");
  if (stage == Stage::kCopied && n.kind == NodeKind::kCompute)
    check(!needs_lowering(n.op, n.operand_layouts), "it shards its classes but was not expanded");
}

}  // namespace

void carry_names(const Pcg& before, const std::vector<ValueId>& remap, Pcg& after) {
  auto at = [&](ValueId v) { return remap[static_cast<std::size_t>(v)]; };
  after.names.clear();
  for (const auto& [name, id] : before.names) after.names[name] = at(id);
  after.loss = before.loss ? std::optional<ValueId>(at(*before.loss)) : std::nullopt;
  after.outputs.clear();
  for (ValueId v : before.outputs) after.outputs.push_back(at(v));
}

void verify(const Pcg& pcg, Stage stage) {
  std::set<std::string> seen;
  for (ValueId id = 0; id < static_cast<ValueId>(pcg.nodes.size()); ++id) {
    const Node& n = pcg.nodes[static_cast<std::size_t>(id)];
    MESHFLOW_CHECK(seen.insert(n.name).second, "graph invariant broken: name \"{}\" twice", n.name);
    verify_node(pcg, id, stage);
  }
  for (const auto& [name, id] : pcg.names) {
    MESHFLOW_CHECK(id >= 0 && id < static_cast<ValueId>(pcg.nodes.size()),
                   "graph invariant broken: name \"{}\" points at no node", name);
  }
  if (pcg.loss) {
    const Node& l = pcg.nodes[static_cast<std::size_t>(*pcg.loss)];
    MESHFLOW_CHECK(l.spec.shape.empty(), "graph invariant broken: the loss is not a scalar");
  }
  const bool decomposed = std::any_of(pcg.nodes.begin(), pcg.nodes.end(),
                                      [](const Node& n) { return n.decomposed.has_value(); });
  if (!decomposed) return;
  MESHFLOW_CHECK(stage == Stage::kCopied, "graph invariant broken: decomposed before copying");
  const std::vector<std::optional<Decomposition>> allowed = decomposable(pcg);
  for (std::size_t id = 0; id < pcg.nodes.size(); ++id) {
    const std::optional<Decomposition>& d = pcg.nodes[id].decomposed;
    if (!d) continue;
    Decomposition want = *d;
    want.form = GatherForm::kPermute;
    MESHFLOW_CHECK(allowed[id] == want,
                   "graph invariant broken at node \"{}\": a decomposition its pattern no longer "
                   "allows",
                   pcg.nodes[id].name);
  }
}

}  // namespace meshflow
