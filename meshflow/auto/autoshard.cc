// The placement problem of a model and the driver that solves it per (ZeRO, M), writes the best
// choices as model files and prices them with the compiler (auto/autoshard.h).
#include "meshflow/auto/autoshard.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>
#include <map>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/graph/parallel_op.h"
#include "meshflow/graph/passes.h"
#include "meshflow/ops/attention.h"
#include "meshflow/ops/strategy.h"
#include "meshflow/plan/plan_cache.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

constexpr double kInfeasible = kInfeasibleSeconds;

std::int64_t shard_bytes_of(const Layout& l) {
  // The chunk rule's largest shard is the first device's.
  return numel(local_shape(l, l.mesh.devices[0])) * static_cast<std::int64_t>(size_of(l.dtype));
}

// Partial read as Replicate: where a value's gradient is brought (parallel_op.h).
Layout gradient_target(const Layout& l) { return with_placements(l, gradient_placements(l)); }

// The layout operand i's gradient comes out in under strategy s: its own shards; Partial on a
// mesh dim where it is replicated while the strategy shards another operand or the result (the
// gradient sums over those shards); Replicate where it was taken Partial.
Layout gradient_layout(const Strategy& s, std::size_t i) {
  const Layout& in = s.inputs[i];
  std::vector<Placement> ps = in.placements;
  for (std::size_t d = 0; d < ps.size(); ++d) {
    if (ps[d].is_partial()) {
      ps[d] = Placement::replicate();
    } else if (ps[d].is_replicate()) {
      bool sharded = s.output.placements[d].is_shard();
      for (std::size_t j = 0; j < s.inputs.size(); ++j)
        if (j != i && s.inputs[j].placements[d].is_shard()) sharded = true;
      if (sharded) ps[d] = Placement::partial();
    }
  }
  return with_placements(in, std::move(ps));
}

// Returns the work points of `op`'s kernel under strategy s on the device that does the most:
// the first device, whose shards are the largest, except for a causal attention, whose later
// query shards see more keys (every device's is counted).
double most_work(const Op& op, const std::vector<TensorSpec>& globals, const Strategy& s) {
  const std::vector<DeviceId> first{s.output.mesh.devices[0]};
  const bool by_offsets = op.causal && is_attention_family(op.type);
  double most = 0;
  for (DeviceId device : by_offsets ? s.output.mesh.devices : first) {
    std::vector<Shape> local;
    ShardOffsets offsets;
    for (const Layout& l : s.inputs) {
      local.push_back(local_shape(l, device));
      offsets.push_back(shard_box(l, device).offset);
    }
    most = std::max(most, work_points(op, globals, local, local_shape(s.output, device), offsets));
  }
  return most;
}

bool is_source(const Node& n) { return n.kind == NodeKind::kInput || n.kind == NodeKind::kWeight; }

bool needs_gradient(const Pcg& pcg, ValueId v) {
  const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
  return n.kind != NodeKind::kInput && is_floating(n.spec.dtype);
}

// Builds the problems of every ZeRO level at once: they differ only in the weights' seconds and
// bytes, so the operand edges' tables (most of the work) are priced once and shared.
struct Builder {
  const Pcg& pcg;
  std::vector<int> zeros;
  int micro_batches;
  const AutoshardOptions& options;
  const MachineModel& machine;
  SearchCache& cache;
  std::vector<DeviceMesh> meshes;  // per node
  std::vector<int> uses;           // per node: operand slots reading it
  std::vector<int> var_of;         // per node: its variable, -1 for a private source
  // Per variable, per choice: the cache's numbers of its result and of where its gradient goes.
  std::vector<std::vector<int>> result_ids, target_ids;
  // Per ZeRO level: its variables' seconds and bytes.
  std::vector<std::vector<ChoiceProblem::Variable>> variables;
  std::vector<ChoiceProblem::Pair> pairs;  // every level's
  std::vector<PlacementProblem::Meaning> meanings;

  Builder(const Pcg& g, std::vector<int> z, int m, const AutoshardOptions& o, SearchCache& c)
      : pcg(g),
        zeros(std::move(z)),
        micro_batches(m),
        options(o),
        machine(o.plan.machine ? *o.plan.machine : default_machine()),
        cache(c),
        variables(zeros.size()) {}

  double move_s(const Layout& from, const Layout& to) {
    return cache.seconds(cache.id(from), cache.id(to));
  }

  double sharing(const DeviceMesh& mesh) const {
    return core_sharing(machine, size(mesh), options.threads_per_device);
  }

  Layout replicated(ValueId v, const DeviceMesh& mesh) const {
    const Node& n = pcg.nodes[static_cast<std::size_t>(v)];
    return make_layout(mesh, std::vector<Placement>(static_cast<std::size_t>(ndim(mesh))),
                       n.spec.shape, n.spec.dtype);
  }

  // A weight's seconds and bytes per step at ZeRO level `zero` in layout w with its gradient
  // made in layout g.
  std::pair<double, std::int64_t> weight_cost(const Layout& w, const Layout& g, int zero) {
    const auto states = static_cast<std::int64_t>(state_names(options.update).size());
    const double share = sharing(w.mesh);
    const std::int64_t wb = shard_bytes_of(w);
    auto update_s = [&](std::int64_t b) {
      return share * kernel_seconds(machine, 0, static_cast<double>(b * (3 + 2 * states)));
    };
    if (zero == 0) return {move_s(g, w) + update_s(wb), wb * (2 + states)};
    const Layout z = zero_layout(w);
    const std::int64_t zb = shard_bytes_of(z);
    if (zero == 1) return {move_s(g, z) + update_s(zb) + move_s(z, w), wb * 2 + zb * states};
    // ZeRO-3: gathered before each use forward and backward, each micro-batch's gradient
    // reduce-scattered into the shard.
    return {micro_batches * (2 * move_s(z, w) + move_s(g, z)) + update_s(zb), zb * (2 + states)};
  }

  void run() {
    const std::size_t n = pcg.nodes.size();
    meshes.resize(n);
    uses.assign(n, 0);
    var_of.assign(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = pcg.nodes[i];
      if (node.mesh) {
        meshes[i] = *node.mesh;
      } else {
        MESHFLOW_CHECK(!node.inputs.empty(), "node \"{}\" has no mesh", node.name);
        meshes[i] = meshes[static_cast<std::size_t>(node.inputs[0])];
      }
      for (ValueId a : node.inputs) ++uses[static_cast<std::size_t>(a)];
    }
    // Sources read by one compute node are that node's; the rest are variables of their own.
    std::vector<bool> private_source(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = pcg.nodes[i];
      if (node.kind != NodeKind::kCompute) continue;
      for (ValueId a : node.inputs) {
        const Node& src = pcg.nodes[static_cast<std::size_t>(a)];
        if (is_source(src) && uses[static_cast<std::size_t>(a)] == 1 &&
            src.source.kind != Source::Kind::kFolder &&
            meshes[static_cast<std::size_t>(a)] == meshes[i])
          private_source[static_cast<std::size_t>(a)] = true;
      }
    }
    // Compute nodes' strategies, first: shared sources take their choices from them.
    std::vector<const std::vector<Strategy>*> strategies_of(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = pcg.nodes[i];
      if (node.kind != NodeKind::kCompute) continue;
      std::vector<Layout> in;
      for (ValueId a : node.inputs) in.push_back(replicated(a, meshes[i]));
      strategies_of[i] = &cache.strategies(node.op, in);
      MESHFLOW_CHECK(!strategies_of[i]->empty(), "node \"{}\" has no strategy", node.name);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = pcg.nodes[i];
      if (is_source(node) && !private_source[i] && uses[i] > 0) add_shared_source(i, strategies_of);
      if (node.kind == NodeKind::kParallel) add_parallel(i);
      if (node.kind == NodeKind::kCompute) add_compute(i, *strategies_of[i], private_source);
    }
  }

  // Adds a variable: `v[k]` its seconds and bytes at ZeRO level zeros[k].
  int add_variable(std::size_t node, std::vector<ChoiceProblem::Variable> v,
                   PlacementProblem::Meaning m) {
    std::vector<int>& ids = result_ids.emplace_back();
    std::vector<int>& targets = target_ids.emplace_back();
    for (const Layout& l : m.results) {
      ids.push_back(cache.id(l));
      targets.push_back(cache.id(gradient_target(l)));
    }
    for (std::size_t k = 0; k < zeros.size(); ++k) variables[k].push_back(std::move(v[k]));
    m.node = static_cast<ValueId>(node);
    meanings.push_back(std::move(m));
    var_of[node] = static_cast<int>(meanings.size()) - 1;
    return var_of[node];
  }

  void add_shared_source(std::size_t i,
                         const std::vector<const std::vector<Strategy>*>& strategies_of) {
    const Node& src = pcg.nodes[i];
    std::vector<Layout> layouts;
    if (src.placements && ndim(meshes[i]) == static_cast<int>(src.placements->size()))
      layouts.push_back(make_layout(meshes[i], *src.placements, src.spec.shape, src.spec.dtype));
    // A sharded folder is taken as it lies: its own layout is its one choice.
    const bool fixed = src.source.kind == Source::Kind::kFolder;
    for (std::size_t c = 0; c < pcg.nodes.size() && !fixed; ++c) {
      const Node& reader = pcg.nodes[c];
      if (reader.kind != NodeKind::kCompute || meshes[c] != meshes[i]) continue;
      for (std::size_t k = 0; k < reader.inputs.size(); ++k) {
        if (reader.inputs[k] != static_cast<ValueId>(i)) continue;
        // A source is never Partial: held replicated where a strategy takes it Partial.
        for (const Strategy& s : *strategies_of[c]) layouts.push_back(gradient_target(s.inputs[k]));
      }
    }
    if (layouts.empty()) layouts.push_back(replicated(static_cast<ValueId>(i), meshes[i]));
    std::vector<Layout> unique;
    for (Layout& l : layouts)
      if (std::find(unique.begin(), unique.end(), l) == unique.end())
        unique.push_back(std::move(l));
    std::vector<ChoiceProblem::Variable> v(zeros.size(), {.name = src.name});
    PlacementProblem::Meaning m;
    for (const Layout& l : unique) {
      for (std::size_t z = 0; z < zeros.size(); ++z) {
        // A weight's readers' edges bring their gradients to it; here the update and the state.
        const auto [s, b] = src.kind == NodeKind::kWeight
                                ? weight_cost(l, l, zeros[z])
                                : std::pair{0.0, shard_bytes_of(l) * micro_batches};
        v[z].seconds.push_back(s);
        v[z].bytes.push_back(b);
      }
      m.results.push_back(l);
      m.sources.emplace_back();
    }
    add_variable(i, std::move(v), std::move(m));
  }

  void add_parallel(std::size_t i) {
    const Node& node = pcg.nodes[i];
    const Layout own = make_layout(meshes[i], *node.placements, node.spec.shape, node.spec.dtype);
    const int var = add_variable(
        i,
        std::vector<ChoiceProblem::Variable>(
            zeros.size(), {.name = node.name, .seconds = {0}, .bytes = {shard_bytes_of(own)}}),
        {.results = {own}, .sources = {{}}});
    const ValueId from = node.inputs[0];
    const int u = var_of[static_cast<std::size_t>(from)];
    MESHFLOW_CHECK(u >= 0, "a parallel op reads a private source");
    ChoiceProblem::Pair pair{.a = u, .b = var};
    for (const Layout& l : meanings[static_cast<std::size_t>(u)].results) {
      double s = kInfeasible;
      try {
        check_parallel_op(node, l, own);
        s = micro_batches *
            (move_s(l, own) +
             (needs_gradient(pcg, from) ? move_s(gradient_target(own), gradient_target(l)) : 0));
      } catch (const Error&) {
      }
      pair.seconds.push_back(s);
    }
    pairs.push_back(std::move(pair));
  }

  void add_compute(std::size_t i, const std::vector<Strategy>& strategies,
                   const std::vector<bool>& private_source) {
    const Node& node = pcg.nodes[i];
    const DeviceMesh& mesh = meshes[i];
    std::vector<TensorSpec> globals;
    std::vector<Layout> in;  // the replicated operands the strategies were priced from
    // The backward's kernels: one like the forward per operand with a gradient, except a
    // product's bias, whose gradient is a pass over the result's gradient.
    const bool product = node.op.type == OpType::kLinear || node.op.type == OpType::kMatmul;
    int with_gradient = 0;
    bool bias_gradient = false;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const ValueId a = node.inputs[k];
      globals.push_back(pcg.nodes[static_cast<std::size_t>(a)].spec);
      in.push_back(replicated(a, mesh));
      if (!needs_gradient(pcg, a)) continue;
      if (product && k == 2) {
        bias_gradient = true;
      } else {
        ++with_gradient;
      }
    }
    const Op op = normalize(node.op, globals);
    std::optional<Layout> pin;
    if (node.placements)
      pin = make_layout(mesh, *node.placements, node.spec.shape, node.spec.dtype);
    std::vector<ChoiceProblem::Variable> v(zeros.size(), {.name = node.name});
    PlacementProblem::Meaning m;
    // Per choice: its strategy (for the operand edges).
    std::vector<const Strategy*> chosen;
    for (const Strategy& s : strategies) {
      std::vector<Layout> results{s.output};
      if (pin && *pin != s.output) results.push_back(*pin);
      const double work = most_work(op, globals, s);
      for (const Layout& result : results) {
        double bytes = static_cast<double>(shard_bytes_of(s.output));
        for (const Layout& l : s.inputs) bytes += static_cast<double>(shard_bytes_of(l));
        const double forward = kernel_seconds(machine, work, bytes);
        double backward = forward * with_gradient;
        if (bias_gradient)
          backward += kernel_seconds(machine, 0, static_cast<double>(shard_bytes_of(s.output)));
        double seconds = micro_batches * sharing(mesh) * (forward + backward);
        // What the strategy moves inside itself (a vocabulary-parallel loss all-reduces its
        // row statistics): its cost beyond bringing replicated operands to it, forward and
        // again backward.
        double own = s.cost_s;
        for (std::size_t k = 0; k < s.inputs.size(); ++k) own -= move_s(in[k], s.inputs[k]);
        seconds += micro_batches * 2 * std::max(0.0, own);
        seconds += micro_batches * (move_s(s.output, result) +
                                    move_s(gradient_target(result), gradient_target(s.output)));
        // Per ZeRO level, summed in the same order for each: the weights the choice owns
        // differ.
        // A value the policy recomputes is not held from forward to backward: its kernel runs
        // once more instead.
        const bool kept = keeps_result(options.recompute.value_or(Recompute::kNone), node);
        if (!kept) seconds += micro_batches * sharing(mesh) * forward;
        std::vector<double> level_s(zeros.size(), seconds);
        std::vector<std::int64_t> level_b(zeros.size(), kept ? shard_bytes_of(result) : 0);
        std::vector<std::pair<int, Layout>> sources;
        for (std::size_t k = 0; k < node.inputs.size(); ++k) {
          const auto a = static_cast<std::size_t>(node.inputs[k]);
          if (!private_source[a]) continue;
          // A source is never Partial: one the strategy takes Partial is held replicated and
          // divided on each device (a local step).
          const Layout held_as = gradient_target(s.inputs[k]);
          sources.emplace_back(static_cast<int>(k), held_as);
          const double divide_s = micro_batches * move_s(held_as, s.inputs[k]);
          const bool weight = pcg.nodes[a].kind == NodeKind::kWeight;
          const Layout gradient = weight ? gradient_layout(s, k) : held_as;
          for (std::size_t z = 0; z < zeros.size(); ++z) {
            level_s[z] += divide_s;
            if (weight) {
              const auto [ws, wb] = weight_cost(held_as, gradient, zeros[z]);
              level_s[z] += ws;
              level_b[z] += wb;
            } else {
              level_b[z] += shard_bytes_of(held_as) * micro_batches;
            }
          }
        }
        for (std::size_t z = 0; z < zeros.size(); ++z) {
          v[z].seconds.push_back(level_s[z]);
          v[z].bytes.push_back(level_b[z]);
        }
        m.results.push_back(result);
        m.sources.push_back(std::move(sources));
        chosen.push_back(&s);
      }
    }
    const int var = add_variable(i, std::move(v), std::move(m));
    // An edge from each operand's variable: the operand moved to the strategy's layout, its
    // gradient back to the operand's.
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const ValueId a = node.inputs[k];
      const int u = var_of[static_cast<std::size_t>(a)];
      if (u < 0) continue;  // private: no move
      const bool grad = needs_gradient(pcg, a);
      std::vector<int> wanted, gradient;
      for (const Strategy* s : chosen) {
        wanted.push_back(cache.id(s->inputs[k]));
        gradient.push_back(grad ? cache.id(gradient_layout(*s, k)) : 0);
      }
      ChoiceProblem::Pair pair{.a = u, .b = var};
      const auto& from_ids = result_ids[static_cast<std::size_t>(u)];
      const auto& target_of = target_ids[static_cast<std::size_t>(u)];
      for (std::size_t f_choice = 0; f_choice < from_ids.size(); ++f_choice) {
        const int f = from_ids[f_choice], target = target_of[f_choice];
        for (std::size_t c = 0; c < chosen.size(); ++c) {
          double sec = cache.seconds(f, wanted[c]);
          if (grad) sec += cache.seconds(gradient[c], target);
          pair.seconds.push_back(micro_batches * sec);
        }
      }
      pairs.push_back(std::move(pair));
    }
  }
};

// ---- model files ----

// The model on one mesh of `shape` named "auto": every tensor on it (replicated unless
// `keep` keeps its placements), no node naming a mesh, pins only where `keep`.
nlohmann::json on_one_mesh(nlohmann::json j, const std::string& shape, bool keep,
                           const std::string& source) {
  const DeviceMesh mesh = parse_mesh(shape);
  j["meshes"] = {{"auto", shape}};
  for (auto& [name, t] : j["tensors"].items()) {
    t["mesh"] = "auto";
    if (!keep)
      t["placements"] = std::vector<std::string>(static_cast<std::size_t>(ndim(mesh)), "R");
  }
  for (auto& n : j["nodes"]) {
    const std::string op = n.value("op", "");
    if (parse_parallel_type(op)) {
      fail(ErrorKind::kInvalidArgument,
           "{}: node \"{}\" is a parallel op ({}), whose placements are for the model's own "
           "mesh: autoshard --mesh needs a model without parallel ops",
           source, n.value("name", ""), op);
    }
    n.erase("mesh");
    if (!keep) n.erase("placements");
  }
  return j;
}

// Rewrites each data path of `j` (relative to `from`) to stay valid from folder `to`.
void rebase_paths(nlohmann::json& j, const std::filesystem::path& from,
                  const std::filesystem::path& to) {
  auto rebase = [&](nlohmann::json& v) {
    if (!v.is_string()) return;
    std::filesystem::path p = v.get<std::string>();
    if (p.is_relative()) p = std::filesystem::absolute(from / p).lexically_normal();
    const std::filesystem::path rel =
        p.lexically_relative(std::filesystem::absolute(to).lexically_normal());
    v = rel.empty() ? p.string() : rel.string();
  };
  for (auto& [name, t] : j["tensors"].items()) {
    for (const char* key : {"input", "weight"})
      if (t.contains(key)) rebase(t[key]);
  }
  // The datasets' splits: a path, a list of paths, or named sample arrays.
  if (!j.contains("data") || !j["data"].is_object()) return;
  for (const char* split : {"train", "val"}) {
    if (!j["data"].contains(split)) continue;
    nlohmann::json& s = j["data"][split];
    if (s.is_string()) rebase(s);
    if (s.is_array() || s.is_object())
      for (auto& [k, v] : s.items()) rebase(v);
  }
}

struct Priced {
  double est_s = 0;
  std::int64_t memory = 0;
  std::vector<std::pair<std::string, Layout>> values;
};

// Prices model file `j` (paths relative to `base`) as `explain --json` does.
std::optional<Priced> price(const nlohmann::json& j, const std::filesystem::path& base,
                            const std::string& source, int zero, int micro_batches,
                            Recompute recompute, const AutoshardOptions& options) {
  try {
    const Model m = parse_model(j.dump(), base, source);
    const Explanation e =
        explain_compiled(m.pcg, {.plan = options.plan,
                                 .update = options.update,
                                 .micro_batches = micro_batches,
                                 .zero = zero,
                                 .recompute = recompute,
                                 .threads_per_device = options.threads_per_device});
    if (!e.step_time || !e.memory) return std::nullopt;
    Priced p{e.step_time->total(), e.memory->peak, {}};
    for (const auto& [name, layout] : e.values)  // the forward values: what the file places
      if (!name.starts_with("grad:")) p.values.emplace_back(name, layout);
    return p;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Writes the choices into the model `j`.
nlohmann::json apply(nlohmann::json j, const Pcg& pcg, const PlacementProblem& p,
                     const SearchResult& r) {
  auto placements = [](const Layout& l) {
    std::vector<std::string> out;
    for (const Placement& pl : l.placements) out.push_back(to_string(pl));
    return out;
  };
  std::map<std::string, std::vector<std::string>> tensors, nodes;
  for (std::size_t v = 0; v < p.meanings.size(); ++v) {
    const auto& m = p.meanings[v];
    const auto c = static_cast<std::size_t>(r.choices[v]);
    const Node& node = pcg.nodes[static_cast<std::size_t>(m.node)];
    if (is_source(node)) {
      tensors[node.name] = placements(m.results[c]);
    } else if (node.kind == NodeKind::kCompute) {
      nodes[node.name] = placements(m.results[c]);
      for (const auto& [k, l] : m.sources[c])
        tensors[pcg.nodes[static_cast<std::size_t>(node.inputs[static_cast<std::size_t>(k)])]
                    .name] = placements(l);
    }
  }
  for (auto& [name, t] : j["tensors"].items())
    if (auto it = tensors.find(name); it != tensors.end()) t["placements"] = it->second;
  for (auto& n : j["nodes"]) {
    if (auto it = nodes.find(n.value("name", "")); it != nodes.end()) n["placements"] = it->second;
  }
  return j;
}

struct Solved {
  int zero = 0, micro_batches = 1;
  Recompute recompute = Recompute::kNone;
  SearchResult result;
  nlohmann::json model;
};

}  // namespace

int SearchCache::id(const Layout& layout) {
  const auto [it, added] = ids_.try_emplace(layout, static_cast<int>(layouts_.size()));
  if (added) layouts_.push_back(layout);
  return it->second;
}

double SearchCache::seconds(int from, int to) {
  if (from == to) return 0;
  const std::int64_t key = (static_cast<std::int64_t>(from) << 32) | static_cast<std::uint32_t>(to);
  if (const auto it = seconds_.find(key); it != seconds_.end()) return it->second;
  double s = kInfeasibleSeconds;
  try {
    s = plans_
            .get(layouts_[static_cast<std::size_t>(from)], layouts_[static_cast<std::size_t>(to)])
            ->est_s;
  } catch (const Error&) {
  }
  seconds_.emplace(key, s);
  return s;
}

const std::vector<Strategy>& SearchCache::strategies(const Op& op,
                                                     const std::vector<Layout>& inputs) {
  StrategyKey key{op, inputs};
  if (const auto it = strategies_.find(key); it != strategies_.end()) return it->second;
  return strategies_.emplace(std::move(key), meshflow::strategies(op, inputs, options_))
      .first->second;
}

std::size_t SearchCache::StrategyHash::operator()(const StrategyKey& k) const {
  std::size_t h = static_cast<std::size_t>(k.op.type);
  for (const Layout& l : k.inputs) h = h * 1000003u ^ hash_value(l);
  return h;
}

std::vector<PlacementProblem> placement_problems(const Pcg& pcg, const std::vector<int>& zeros,
                                                 int micro_batches, const AutoshardOptions& options,
                                                 SearchCache& cache) {
  Builder b(pcg, zeros, micro_batches, options, cache);
  b.run();
  std::vector<PlacementProblem> out;
  for (std::size_t z = 0; z < zeros.size(); ++z) {
    // The last level takes the shared tables; the others copy them.
    const bool last = z + 1 == zeros.size();
    out.push_back({.problem = {.variables = std::move(b.variables[z]),
                               .pairs = last ? std::move(b.pairs) : b.pairs},
                   .meanings = last ? std::move(b.meanings) : b.meanings});
  }
  return out;
}

AutoshardResult autoshard(const std::filesystem::path& path, const AutoshardOptions& options,
                          const std::filesystem::path& out_dir) {
  const auto start = std::chrono::steady_clock::now();
  const std::string source = path.string();
  const std::filesystem::path base = path.parent_path().empty() ? "." : path.parent_path();
  const nlohmann::json original = parse_json(read_file(path), source);
  const nlohmann::json searched =
      options.mesh ? on_one_mesh(original, *options.mesh, false, source) : original;
  const Model model = parse_model(searched.dump(), base, source);
  if (!model.pcg.loss)
    fail(ErrorKind::kInvalidArgument, "{}: autoshard needs a model that names a \"loss\"", source);
  const nlohmann::json train = model.train.is_object() ? model.train : nlohmann::json::object();
  std::vector<int> zeros = {0, 1, 3};
  if (options.zero) {
    zeros = {*options.zero};
  } else if (train.contains("zero")) {
    zeros = {train["zero"].get<int>()};
  }
  std::vector<int> counts = {1, 2, 4, 8, 16};
  if (options.micro_batches) {
    counts = {*options.micro_batches};
  } else if (train.contains("micro_batches")) {
    counts = {train["micro_batches"].get<int>()};
  }

  // The recomputation policies searched: the given one (or the file's), else none alone
  // without a memory limit (recomputing only adds work), else each (full where the model marks
  // a node).
  std::optional<Recompute> fixed_recompute = options.recompute;
  if (!fixed_recompute && train.contains("recompute") && train["recompute"].is_string())
    fixed_recompute = parse_recompute(train["recompute"].get<std::string>());
  std::vector<Recompute> policies = {Recompute::kNone};
  if (fixed_recompute) {
    policies = {*fixed_recompute};
  } else if (options.memory_limit) {
    policies = {Recompute::kNone, Recompute::kSelective};
    if (marks_checkpoint(model.pcg)) policies.push_back(Recompute::kFull);
  }

  AutoshardResult r;
  SearchCache cache(options.plan);  // shared by every (ZeRO, M, policy)
  std::vector<Solved> solved;
  // The least memory a choice priced by the compiler needs (for the error when none fits).
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  std::optional<Solved> smallest;  // the search's least-memory choice where none fitted
  for (Recompute policy : policies) {
    AutoshardOptions with = options;
    with.recompute = policy;
    // Under the cost model more micro-batches never make a step faster on its own meshes (the
    // same work in more pieces): a larger M is tried only where a smaller one did not fit.
    for (int m : counts) {
      Pcg split;
      try {
        split = split_micro_batches(model.pcg, m);
      } catch (const Error&) {
        if (counts.size() == 1) throw;
        continue;
      }
      bool fitted = false;
      // The levels' problems are built together and solved at once, each on a thread of its own
      // (solving is pure).
      const std::vector<PlacementProblem> problems =
          placement_problems(split, zeros, m, with, cache);
      std::vector<std::future<std::optional<SearchResult>>> solving;
      for (const PlacementProblem& p : problems) {
        solving.push_back(std::async(std::launch::async, [&p, &options] {
          return solve(p.problem, {.memory_limit = options.memory_limit});
        }));
      }
      for (std::size_t k = 0; k < zeros.size(); ++k) {
        const int z = zeros[k];
        const PlacementProblem& p = problems[k];
        const std::optional<SearchResult> best = solving[k].get();
        if (!best) {
          // Kept to say how much memory the smallest choice needs, if nothing fits.
          const std::optional<SearchResult> small = solve(p.problem, {.minimise_bytes = true});
          if (small && (!smallest || small->bytes < smallest->result.bytes))
            smallest = Solved{z, m, policy, *small, apply(searched, split, p, *small)};
          // The memory model adds every kept value as if all were held at once: the compiler,
          // which knows when each is dropped, may still find the fastest choice fits.
          if (const std::optional<SearchResult> fastest = solve(p.problem, {});
              fastest && fastest->seconds < kInfeasible) {
            solved.push_back({z, m, policy, *fastest, apply(searched, split, p, *fastest)});
          }
          continue;
        }
        if (best->seconds >= kInfeasible) continue;
        r.exact = r.exact && best->exact;
        fitted = true;
        solved.push_back({z, m, policy, *best, apply(searched, split, p, *best)});
      }
      if (fitted && options.memory_limit) break;
      if (!options.memory_limit) break;
    }
  }
  r.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Price with the compiler in the search's order: the first that fits, and the next where the
  // search puts it within 1% (the compiler may order near-ties otherwise). The model's own
  // placements are priced too. The first two candidates and the model's own are priced at once,
  // on threads of their own (compiling is pure); the rest, where those do not fit, in turn.
  std::sort(solved.begin(), solved.end(),
            [](const Solved& a, const Solved& b) { return a.result.seconds < b.result.seconds; });
  const int given_zero = options.zero.value_or(train.value("zero", 0));
  const int given_m = options.micro_batches.value_or(train.value("micro_batches", 1));
  const Recompute given_recompute = fixed_recompute.value_or(Recompute::kNone);
  std::optional<nlohmann::json> given;
  try {
    given = options.mesh ? on_one_mesh(original, *options.mesh, true, source) : original;
  } catch (const Error&) {
  }
  auto price_later = [&](const nlohmann::json& j, int zero, int m, Recompute policy) {
    return std::async(std::launch::async, [&j, &base, &source, &options, zero, m, policy] {
      return price(j, base, source, zero, m, policy, options);
    });
  };
  std::vector<std::future<std::optional<Priced>>> ahead;
  for (std::size_t i = 0; i < std::min<std::size_t>(2, solved.size()); ++i) {
    ahead.push_back(
        price_later(solved[i].model, solved[i].zero, solved[i].micro_batches, solved[i].recompute));
  }
  std::future<std::optional<Priced>> given_priced;
  if (given) given_priced = price_later(*given, given_zero, given_m, given_recompute);
  // Per policy (the search prices recomputation roughly: the compiler compares the policies).
  std::optional<Priced> best;
  for (Recompute policy : policies) {
    std::optional<double> first_fit;
    int near_ties = 0;
    for (std::size_t i = 0; i < solved.size(); ++i) {
      const Solved& s = solved[i];
      if (s.recompute != policy) continue;
      if (first_fit && (s.result.seconds > 1.01 * *first_fit || ++near_ties > 1)) break;
      const std::optional<Priced> priced =
          i < ahead.size()
              ? ahead[i].get()
              : price(s.model, base, source, s.zero, s.micro_batches, s.recompute, options);
      if (!priced) continue;
      if (options.memory_limit && priced->memory > *options.memory_limit) {
        least = std::min(least, priced->memory);
        continue;
      }
      if (!first_fit) first_fit = s.result.seconds;
      if (!best || priced->est_s < best->est_s) {
        best = priced;
        r.model = s.model;
        r.zero = s.zero;
        r.micro_batches = s.micro_batches;
        r.recompute = s.recompute;
      }
    }
  }
  for (auto& f : ahead)
    if (f.valid()) f.wait();  // a candidate priced ahead but not needed
  if (given) {
    if (const std::optional<Priced> priced = given_priced.get()) {
      r.given_est_step_s = priced->est_s;
      const bool fits = !options.memory_limit || priced->memory <= *options.memory_limit;
      if (!fits) least = std::min(least, priced->memory);
      if (fits && (!best || priced->est_s < best->est_s)) {
        best = priced;
        r.model = *given;
        r.zero = given_zero;
        r.micro_batches = given_m;
        r.recompute = given_recompute;
        r.given_won = true;
      }
    }
  }
  if (!best && smallest) {
    const std::optional<Priced> priced =
        price(smallest->model, base, source, smallest->zero, smallest->micro_batches,
              smallest->recompute, options);
    least = std::min(least, priced ? priced->memory : smallest->result.bytes);
  }
  if (!best && !options.memory_limit) {
    fail(ErrorKind::kInvalidArgument,
         "{}: no placement of this model compiles on {}: check its parallel ops' degrees", source,
         options.mesh ? "mesh " + *options.mesh : std::string("its meshes"));
  }
  if (!best) {
    fail(ErrorKind::kInvalidArgument,
         "{}: no placement fits --memory-limit {} bytes per device: the least any choice needs "
         "is {} bytes",
         source, options.memory_limit.value_or(0), least);
  }
  r.est_step_s = best->est_s;
  r.memory_per_device_bytes = best->memory;
  r.values = best->values;
  nlohmann::json t = train;
  t["optimizer"] = std::string(to_string(options.update.kind));
  t["zero"] = r.zero;
  t["micro_batches"] = r.micro_batches;
  t["recompute"] = std::string(to_string(r.recompute));
  r.model["train"] = t;
  rebase_paths(r.model, base, out_dir);
  r.priced_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - r.search_s;
  return r;
}

nlohmann::json to_json(const AutoshardResult& r) {
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [name, layout] : r.values) values[name] = layout_json(layout);

  return {{"est_step_s", r.est_step_s},
          {"given_est_step_s", r.given_est_step_s ? nlohmann::json(*r.given_est_step_s) : nullptr},
          {"memory_per_device_bytes", r.memory_per_device_bytes},
          {"zero", r.zero},
          {"micro_batches", r.micro_batches},
          {"recompute", std::string(to_string(r.recompute))},
          {"search_s", r.search_s},
          {"priced_s", r.priced_s},
          {"exact", r.exact},
          {"values", values}};
}

}  // namespace meshflow
