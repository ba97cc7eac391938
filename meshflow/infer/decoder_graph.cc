#include "meshflow/infer/decoder_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/ops/op.h"

namespace meshflow {

namespace {

// Where a value carries the token input's batch and position dims: -1 where it does not; a
// value whose one dim holds both (batch-major, [B·S, ...]) has merged set.
struct Roles {
  int batch = -1, position = -1;
  bool merged = false;
  bool any() const { return batch >= 0 || position >= 0; }
};

std::int64_t product(const Shape& s, std::size_t from, std::size_t to) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

const Node& node_of(const Pcg& pcg, ValueId v) { return pcg.nodes[static_cast<std::size_t>(v)]; }

// Gives value `v` the name `name`, one with a ':' (reserved for names meshflow makes, so it
// meets none of the model's).
void rename(Pcg& pcg, ValueId v, const std::string& name) {
  Node& n = pcg.nodes[static_cast<std::size_t>(v)];
  pcg.names.erase(n.name);
  n.name = name;
  pcg.names[name] = v;
}

}  // namespace

GenerateNames generate_names(const Model& model) {
  const nlohmann::json& g = model.generate;
  if (!g.is_object() || !g.contains("tokens") || !g.contains("logits") ||
      !g["tokens"].is_string() || !g["logits"].is_string()) {
    fail(ErrorKind::kInvalidArgument,
         "{}: generation needs a \"generate\" object {{\"tokens\": <the [B, S] token input>, "
         "\"logits\": <the node of logits>}}",
         model.source);
  }
  GenerateNames names{g["tokens"].get<std::string>(), g["logits"].get<std::string>()};
  auto find = [&](const std::string& name, std::string_view field) -> const Node& {
    auto it = model.pcg.names.find(name);
    if (it == model.pcg.names.end())
      fail(ErrorKind::kInvalidArgument, "{}: \"generate\": \"{}\" names no tensor or node \"{}\"",
           model.source, field, name);
    return node_of(model.pcg, it->second);
  };
  const Node& tokens = find(names.tokens, "tokens");
  if (tokens.kind != NodeKind::kInput || tokens.spec.shape.size() != 2 ||
      (tokens.spec.dtype != DType::kInt32 && tokens.spec.dtype != DType::kInt64)) {
    fail(ErrorKind::kInvalidArgument,
         "{}: \"generate\": \"tokens\" is \"{}\", which is not an int32 or int64 [B, S] input",
         model.source, names.tokens);
  }
  const Node& logits = find(names.logits, "logits");
  const Shape& s = logits.spec.shape;
  const std::int64_t b = tokens.spec.shape[0], seq = tokens.spec.shape[1];
  const bool fits =
      (s.size() == 3 && s[0] == b && s[1] == seq) || (s.size() == 2 && s[0] == b * seq);
  if (!is_floating(logits.spec.dtype) || !fits) {
    fail(ErrorKind::kInvalidArgument,
         "{}: \"generate\": \"logits\" is \"{}\" of shape {}, not [{}, {}, V] or [{}, V]",
         model.source, names.logits, to_string(s), b, seq, b * seq);
  }
  return names;
}

namespace {

struct Builder {
  const Model& model;
  const GenerateNames& names;
  const DecoderShape& shape;
  const std::map<std::string, CacheLayouts>& layouts;
  DecoderGraph out;
  std::int64_t seq0 = 0;                     // the model's S
  std::vector<ValueId> remap;                // old id -> new id (-1: not built)
  std::vector<Roles> roles;                  // per old id
  std::map<ValueId, ValueId> position_read;  // old weight id -> its embedding at the positions

  [[noreturn]] void refuse(const Node& n, std::string_view why) {
    fail(ErrorKind::kInvalidArgument, "{}: node \"{}\" {}: generate cannot follow it", model.source,
         n.name, why);
  }

  // The new size of a dim with `r`'s role at dim `d` (or its old size).
  std::int64_t resized(const Roles& r, int d, std::int64_t old) const {
    if (r.merged && d == r.position) return shape.batch * shape.length;
    if (d == r.batch) return shape.batch;
    if (d == r.position) return shape.length;
    return old;
  }

  ValueId positions_of(ValueId weight) {
    auto it = position_read.find(weight);
    if (it != position_read.end()) return it->second;
    const Node& w = node_of(model.pcg, weight);
    const ValueId v =
        add_compute(out.pcg, "generate_read_" + w.name, Op{.type = OpType::kEmbedding},
                    {out.positions, remap[static_cast<std::size_t>(weight)]});
    rename(out.pcg, v, "positions:" + w.name);
    position_read[weight] = v;
    return v;
  }

  Roles reshape_roles(const Node& n, const Roles& in, const Shape& from, const Shape& to, Op& op) {
    Roles r;
    std::vector<int> groups;  // per input dim: the output dim holding it (-1: split)
    for (std::size_t d = 0; d < from.size(); ++d) {
      int found = -1;
      for (std::size_t q = 0; q < to.size() && found < 0; ++q) {
        // output dim q holds input dims [a, b] whole when the prefix products meet
        for (std::size_t a = 0; a <= d; ++a) {
          if (product(to, 0, q) != product(from, 0, a)) continue;
          for (std::size_t b = d; b < from.size(); ++b)
            if (product(to, 0, q + 1) == product(from, 0, b + 1)) {
              found = static_cast<int>(q);
              break;
            }
          if (found >= 0) break;
        }
      }
      groups.push_back(found);
    }
    auto mapped = [&](int d) -> int {
      if (d < 0) return -1;
      const int q = groups[static_cast<std::size_t>(d)];
      if (q < 0) refuse(n, "splits the positions or the batch over several dims");
      return q;
    };
    const int qb = in.merged ? mapped(in.position) : mapped(in.batch);
    const int qp = mapped(in.position);
    // A dim that holds the position or the batch may hold only them (and size-1 dims).
    for (std::size_t d = 0; d < from.size(); ++d) {
      const int q = groups[d];
      if (q < 0 || from[d] == 1) continue;
      const bool role = static_cast<int>(d) == in.batch || static_cast<int>(d) == in.position;
      if (!role && (q == qb || q == qp)) refuse(n, "merges the positions with another dim");
    }
    r.batch = qb;
    r.position = qp;
    r.merged = qb >= 0 && qb == qp;
    if (qb >= 0 && qp >= 0 && !r.merged && qb > qp)
      refuse(n, "puts the positions before the batch");
    for (int q : {qb, qp}) {
      if (q < 0 || op.shape[static_cast<std::size_t>(q)] == -1) continue;
      op.shape[static_cast<std::size_t>(q)] = resized(r, q, 0);
    }
    return r;
  }

  void add(ValueId id) {
    const Node& n = node_of(model.pcg, id);
    const auto i = static_cast<std::size_t>(id);
    if (n.kind == NodeKind::kInput) {
      if (n.name != names.tokens)
        refuse(n,
               "is an input other than the token input \"" + names.tokens + "\" the logits read");
      return;  // built first
    }
    if (n.kind == NodeKind::kWeight) {
      remap[i] = add_weight(out.pcg, n.name, n.spec, *n.mesh, *n.placements, n.source);
      return;
    }
    if (n.kind == NodeKind::kParallel) {
      const ValueId in = n.inputs.front();
      roles[i] = roles[static_cast<std::size_t>(in)];
      remap[i] = add_parallel(out.pcg, n.name, n.parallel, remap[static_cast<std::size_t>(in)],
                              n.mesh, *n.placements);
      return;
    }
    MESHFLOW_CHECK(n.kind == NodeKind::kCompute, "a built graph holds {}", n.name);
    std::vector<TensorSpec> specs;
    for (ValueId v : n.inputs) specs.push_back(node_of(model.pcg, v).spec);
    const Op op = normalize(n.op, specs);
    Op made = n.op;
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(remap[static_cast<std::size_t>(v)]);
    Roles r;
    const Roles& first = roles[static_cast<std::size_t>(n.inputs.front())];
    switch (op.type) {
      case OpType::kReshape:
        r = reshape_roles(n, first, specs[0].shape, n.spec.shape, made);
        break;
      case OpType::kTranspose:
        for (std::size_t j = 0; j < op.dims.size(); ++j) {
          if (op.dims[j] == first.batch) r.batch = static_cast<int>(j);
          if (op.dims[j] == first.position) r.position = static_cast<int>(j);
        }
        r.merged = first.merged;
        if (r.batch >= 0 && r.position >= 0 && !r.merged && r.batch > r.position)
          refuse(n, "puts the positions before the batch");
        break;
      case OpType::kAttention:
        r = first;  // the result's dims are q's but for the last (Dv)
        break;
      case OpType::kSlice:
        if (op.dim == first.batch || op.dim == first.position)
          refuse(n, "slices the positions or the samples");
        [[fallthrough]];
      default:
        r = labelled_roles(n, op, specs, inputs);
        break;
    }
    if (op.type == OpType::kAttention) {
      const int seq = static_cast<int>(specs[0].shape.size()) - 2;
      for (ValueId v : n.inputs) {
        const Roles& x = roles[static_cast<std::size_t>(v)];
        if (x.position != seq || x.merged)
          refuse(n, "attends along a dim that is not the positions");
      }
      if (!op.causal) refuse(n, "attends without the causal mask (each position reads later ones)");
      if (shape.capacity > 0) {
        auto it = layouts.find(n.name);
        MESHFLOW_CHECK(it != layouts.end(), "no cache layout for {}", n.name);
        const ValueId ck = add_input(out.pcg, "generate_cache_k",
                                     {it->second.k.shape, it->second.k.dtype}, it->second.k.mesh,
                                     it->second.k.placements, Source{.kind = Source::Kind::kZeros});
        const ValueId cv = add_input(out.pcg, "generate_cache_v",
                                     {it->second.v.shape, it->second.v.dtype}, it->second.v.mesh,
                                     it->second.v.placements, Source{.kind = Source::Kind::kZeros});
        rename(out.pcg, ck, "cache_k:" + n.name);
        rename(out.pcg, cv, "cache_v:" + n.name);
        out.pcg.nodes[static_cast<std::size_t>(ck)].batch = false;
        out.pcg.nodes[static_cast<std::size_t>(cv)].batch = false;
        out.caches[n.name] = {ck, cv};
        made = Op{.type = OpType::kCachedAttention};
        inputs.insert(inputs.end(), {ck, cv, out.positions});
      }
    }
    roles[i] = r;
    std::optional<std::vector<Placement>> placements = n.placements;
    remap[i] = add_compute(out.pcg, n.name, made, inputs, n.mesh, placements);
  }

  // The roles of an operator's result through its dim labels; swaps a position table operand
  // (in `inputs`) for its embedding at the positions.
  Roles labelled_roles(const Node& n, const Op& op, const std::vector<TensorSpec>& specs,
                       std::vector<ValueId>& inputs) {
    const DimLabels labels = dim_labels(op, specs);
    std::optional<int> batch_label, position_label;
    bool merged = false;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const Roles& x = roles[static_cast<std::size_t>(n.inputs[k])];
      auto label = [&](int d) { return labels.inputs[k][static_cast<std::size_t>(d)]; };
      if (x.batch >= 0 && !x.merged) {
        if (batch_label && *batch_label != label(x.batch)) refuse(n, "mixes samples");
        batch_label = label(x.batch);
      }
      if (x.position >= 0) {
        if (position_label && *position_label != label(x.position)) refuse(n, "mixes positions");
        position_label = label(x.position);
        merged = merged || x.merged;
      }
    }
    if (op.type == OpType::kSoftmax && position_label &&
        labels.inputs[0][static_cast<std::size_t>(op.dim)] == *position_label)
      refuse(n, "normalises along the positions");
    if (op.type == OpType::kLayerNorm && position_label &&
        labels.inputs[0].back() == *position_label)
      refuse(n, "normalises along the positions");
    for (std::optional<int> l : {position_label, batch_label}) {
      if (!l) continue;
      if (std::find(labels.statistics.begin(), labels.statistics.end(), *l) !=
          labels.statistics.end())
        refuse(n, "reduces over the positions or the samples");
    }
    // Operands that carry the labels without the roles: a position table, or refused.
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const Roles& x = roles[static_cast<std::size_t>(n.inputs[k])];
      if (x.any()) continue;
      const std::vector<int>& l = labels.inputs[k];
      for (std::size_t d = 0; d < l.size(); ++d) {
        if (l[d] == kBroadcastLabel) continue;
        if (batch_label && l[d] == *batch_label)
          refuse(n, fmt::format("reads \"{}\" along the samples",
                                node_of(model.pcg, n.inputs[k]).name));
        if (!position_label || l[d] != *position_label) continue;
        const Node& w = node_of(model.pcg, n.inputs[k]);
        if (w.kind != NodeKind::kWeight || w.spec.shape.size() != 2 || d != 0 ||
            w.spec.shape[0] != seq0)
          refuse(n, fmt::format("reads \"{}\" along the positions (only a weight [S, D] added "
                                "at the positions is read at them)",
                                w.name));
        inputs[k] = positions_of(n.inputs[k]);
      }
    }
    Roles r;
    for (std::size_t d = 0; d < labels.output.size(); ++d) {
      if (batch_label && labels.output[d] == *batch_label) r.batch = static_cast<int>(d);
      if (position_label && labels.output[d] == *position_label) r.position = static_cast<int>(d);
    }
    if (position_label && r.position < 0) refuse(n, "sums over the positions");
    if (batch_label && r.batch < 0) refuse(n, "sums over the samples");
    r.merged = merged;
    if (merged) r.batch = r.position;
    return r;
  }
};

}  // namespace

DecoderGraph decoder_graph(const Model& model, const GenerateNames& names,
                           const DecoderShape& shape,
                           const std::map<std::string, CacheLayouts>& layouts) {
  MESHFLOW_CHECK(shape.batch >= 1 && shape.length >= 1);
  Builder b{.model = model, .names = names, .shape = shape, .layouts = layouts};
  const Pcg& g = model.pcg;
  const ValueId tokens = find_value(g, names.tokens);
  const ValueId logits = find_value(g, names.logits);
  const Node& t = node_of(g, tokens);
  b.seq0 = t.spec.shape[1];
  b.out.context = b.seq0;
  b.out.vocabulary = node_of(g, logits).spec.shape.back();
  if (shape.capacity > b.seq0 || shape.length > b.seq0)
    fail(ErrorKind::kInvalidArgument, "{} positions exceed the model's context of {}",
         std::max(shape.capacity, shape.length), b.seq0);
  // The logits' ancestors.
  std::vector<bool> needed(g.nodes.size(), false);
  needed[static_cast<std::size_t>(logits)] = true;
  for (auto v = static_cast<std::size_t>(logits) + 1; v-- > 0;) {
    if (!needed[v]) continue;
    for (ValueId in : g.nodes[v].inputs) needed[static_cast<std::size_t>(in)] = true;
  }
  b.remap.assign(g.nodes.size(), -1);
  b.roles.assign(g.nodes.size(), Roles{});
  b.out.tokens = add_input(b.out.pcg, t.name, {{shape.batch, shape.length}, t.spec.dtype}, *t.mesh,
                           *t.placements, Source{.kind = Source::Kind::kProvided});
  b.out.pcg.nodes[static_cast<std::size_t>(b.out.tokens)].batch = false;
  b.remap[static_cast<std::size_t>(tokens)] = b.out.tokens;
  b.roles[static_cast<std::size_t>(tokens)] = {.batch = 0, .position = 1};
  std::vector<Placement> replicated(t.placements->size(), Placement::replicate());
  b.out.positions = add_input(b.out.pcg, "generate_positions", {{shape.length}, DType::kInt64},
                              *t.mesh, replicated, Source{.kind = Source::Kind::kProvided});
  rename(b.out.pcg, b.out.positions, "positions:");
  b.out.pcg.nodes[static_cast<std::size_t>(b.out.positions)].batch = false;
  for (std::size_t v = 0; v < g.nodes.size(); ++v)
    if (needed[v] && static_cast<ValueId>(v) != tokens) b.add(static_cast<ValueId>(v));
  b.out.logits = b.remap[static_cast<std::size_t>(logits)];
  const Roles& lr = b.roles[static_cast<std::size_t>(logits)];
  const Node& ln = node_of(g, logits);
  const bool row_major = (ln.spec.shape.size() == 3 && lr.batch == 0 && lr.position == 1) ||
                         (ln.spec.shape.size() == 2 && lr.merged && lr.position == 0);
  if (!row_major) b.refuse(ln, "holds its logits in another order than [B, S, V] or [B·S, V]");
  add_output(b.out.pcg, b.out.logits);
  return std::move(b.out);
}

std::map<std::string, CacheLayouts> decoder_cache_layouts(const Pcg& compiled,
                                                          std::int64_t capacity) {
  std::map<std::string, CacheLayouts> out;
  for (const Node& n : compiled.nodes) {
    if (n.kind != NodeKind::kCompute || n.op.type != OpType::kAttention || !n.op.causal) continue;
    auto at = [&](std::size_t k) {
      Layout l = n.operand_layouts.at(k);
      l.shape[l.shape.size() - 2] = capacity;
      return make_layout(l.mesh, l.placements, l.shape, l.dtype);
    };
    out[n.name] = {at(1), at(2)};
  }
  return out;
}

}  // namespace meshflow
