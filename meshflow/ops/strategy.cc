#include "meshflow/ops/strategy.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "meshflow/core/error.h"
#include "meshflow/ops/elementwise.h"

namespace meshflow {

namespace {

std::vector<int> iota(int from, int to) {
  std::vector<int> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

int rank_of(const TensorSpec& s) { return static_cast<int>(s.shape.size()); }

// Labels of an operand broadcast against a result of `out` shape: aligned at the last dim, a
// stretched size-1 dim is kBroadcastLabel.
std::vector<int> broadcast_labels(const Shape& operand, const Shape& out) {
  std::vector<int> labels;
  const std::size_t shift = out.size() - operand.size();
  for (std::size_t i = 0; i < operand.size(); ++i) {
    const bool stretched = operand[i] == 1 && out[i + shift] != 1;
    labels.push_back(stretched ? kBroadcastLabel : static_cast<int>(i + shift));
  }
  return labels;
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// One mesh dim's choice: a placement per operand and for the result.
struct DimChoice {
  std::vector<Placement> inputs;
  Placement output;
};

std::vector<DimChoice> dim_choices(const DimLabels& l, const std::vector<TensorSpec>& in) {
  const std::size_t n = in.size();
  std::vector<DimChoice> choices;
  choices.push_back({std::vector<Placement>(n, Placement::replicate()), Placement::replicate()});
  // Shard one label.
  std::vector<int> labels;
  for (const auto& dims : l.inputs)
    for (int label : dims)
      if (label != kBroadcastLabel && !contains(labels, label)) labels.push_back(label);
  std::sort(labels.begin(), labels.end());
  for (int label : labels) {
    if (contains(l.unshardable, label)) continue;
    DimChoice c{std::vector<Placement>(n, Placement::replicate()), Placement::replicate()};
    for (std::size_t i = 0; i < n; ++i) {
      const auto& dims = l.inputs[i];
      auto it = std::find(dims.begin(), dims.end(), label);
      if (it != dims.end()) c.inputs[i] = Placement::shard(static_cast<int>(it - dims.begin()));
    }
    auto out = std::find(l.output.begin(), l.output.end(), label);
    if (out != l.output.end()) {
      c.output = Placement::shard(static_cast<int>(out - l.output.begin()));
    } else {  // summed away: each device holds a term of the sum
      c.output = Placement::partial(ReduceOp::kSum);
      // additive operands without the label (a bias) become terms too
      for (int t : l.terms) {
        Placement& p = c.inputs[static_cast<std::size_t>(t)];
        if (p.is_replicate()) p = Placement::partial(ReduceOp::kSum);
      }
    }
    choices.push_back(std::move(c));
  }
  // Partial, by linearity.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const Placement p = Placement::partial(op);
    auto base = [&] {
      DimChoice c{std::vector<Placement>(n, Placement::replicate()), p};
      for (int t : l.terms) c.inputs[static_cast<std::size_t>(t)] = p;
      return c;
    };
    if (l.factors.empty()) {
      if (!l.terms.empty()) choices.push_back(base());
      continue;
    }
    for (int f : l.factors) {
      DimChoice c = base();
      c.inputs[static_cast<std::size_t>(f)] = p;
      choices.push_back(std::move(c));
    }
  }
  return choices;
}

std::int64_t shard_degree(const Layout& layout) {
  std::int64_t d = 1;
  for (std::size_t m = 0; m < layout.placements.size(); ++m)
    if (layout.placements[m].is_shard()) d *= layout.mesh.shape[m];
  return d;
}

std::string operand_text(const std::vector<Layout>& inputs) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    s += fmt::format("{}operand {}: {}", i ? "; " : "", i, to_string(inputs[i]));
  return s;
}

}  // namespace

DimLabels dim_labels(const Op& op, const std::vector<TensorSpec>& in) {
  DimLabels l;
  const Shape out = infer(op, in).shape;
  const int r = static_cast<int>(out.size());
  switch (op.type) {
    case OpType::kAdd:
    case OpType::kSub:
    case OpType::kMul:
    case OpType::kDiv:
      l.inputs = {broadcast_labels(in[0].shape, out), broadcast_labels(in[1].shape, out)};
      l.output = iota(0, r);
      if (op.type == OpType::kAdd || op.type == OpType::kSub) l.terms = {0, 1};
      if (op.type == OpType::kMul) l.factors = {0, 1};
      if (op.type == OpType::kDiv) l.factors = {0};
      return l;
    case OpType::kMatmul: {  // a[..., m, k] b[k, n]: k is label r
      std::vector<int> a = iota(0, r - 1);
      a.push_back(r);
      l.inputs = {a, {r, r - 1}};
      l.output = iota(0, r);
      l.factors = {0, 1};
      return l;
    }
    case OpType::kLinear: {  // x[..., in] w[in, out] b[out]: in is label r
      std::vector<int> x = iota(0, r - 1);
      x.push_back(r);
      l.inputs = {x, {r, r - 1}};
      if (in.size() == 3) l.inputs.push_back({r - 1});
      l.output = iota(0, r);
      l.factors = {0, 1};
      if (in.size() == 3) l.terms = {2};
      return l;
    }
    case OpType::kMatmulGradA: {  // g[..., m, n] b[k, n] -> [..., m, k]: n is label r
      std::vector<int> g = iota(0, r - 1);
      g.push_back(r);
      l.inputs = {g, {r - 1, r}};
      l.output = iota(0, r);
      l.factors = {0, 1};
      return l;
    }
    case OpType::kMatmulGradB: {  // a[..., m, k] g[..., m, n] -> [k, n]
      const int ra = rank_of(in[0]);
      std::vector<int> a = iota(2, ra + 1), g = iota(2, ra + 1);
      a.push_back(0);
      g.push_back(1);
      l.inputs = {a, g};
      l.output = {0, 1};
      l.factors = {0, 1};
      return l;
    }
    case OpType::kSum:
    case OpType::kMean: {
      l.inputs = {iota(0, rank_of(in[0]))};
      for (int d = 0; d < rank_of(in[0]); ++d)
        if (!contains(op.dims, d)) l.output.push_back(d);
      l.terms = {0};
      return l;
    }
    case OpType::kSumTo: {
      const int rg = rank_of(in[0]);
      const int extra = rg - r;
      l.inputs = {iota(0, rg)};
      for (int j = 0; j < r; ++j) {
        const bool collapsed = out[j] == 1 && in[0].shape[j + extra] != 1;
        l.output.push_back(collapsed ? rg + j : j + extra);
      }
      l.terms = {0};
      return l;
    }
    case OpType::kBroadcastTo: {
      l.output = iota(0, r);
      std::vector<int> g;
      for (int d = 0; d < r; ++d)
        if (!contains(op.dims, d)) g.push_back(d);
      l.inputs = {g};
      l.terms = {0};
      return l;
    }
    case OpType::kSoftmax:
    case OpType::kSoftmaxGrad:
      l.inputs.assign(in.size(), iota(0, r));
      l.output = iota(0, r);
      l.unshardable = {op.dim};
      if (op.type == OpType::kSoftmaxGrad) l.factors = {0};
      return l;
    case OpType::kSoftmaxCrossEntropy:
    case OpType::kSoftmaxCrossEntropyGrad:
      l.inputs = {{0, 1}, {0}};
      l.unshardable = {1};
      if (op.type == OpType::kSoftmaxCrossEntropyGrad) {
        l.inputs.push_back({});
        l.output = {0, 1};
        l.factors = {2};
      }
      return l;
    case OpType::kMse:
    case OpType::kMseGrad: {
      const int ra = rank_of(in[0]);
      l.inputs = {iota(0, ra), iota(0, ra)};
      if (op.type == OpType::kMseGrad) {
        l.inputs.push_back({});
        l.output = iota(0, ra);
        l.factors = {2};
      }
      return l;
    }
    default:  // unary elementwise operators and their gradients
      l.inputs.assign(in.size(), iota(0, r));
      l.output = iota(0, r);
      if (op.type == OpType::kNeg) l.terms = {0};
      if (is_unary_grad(op.type)) l.factors = {0};
      return l;
  }
}

std::string to_text(const Strategy& s) {
  std::string t;
  for (std::size_t i = 0; i < s.inputs.size(); ++i)
    t += (i ? " + " : "") + to_string(s.inputs[i].placements);
  return fmt::format("{} -> {}  cost {:.3g} s", t, to_string(s.output.placements), s.cost_s);
}

std::vector<Strategy> strategies(const Op& raw, const std::vector<Layout>& inputs,
                                 const PlanOptions& options) {
  std::vector<TensorSpec> specs;
  for (const Layout& l : inputs) specs.push_back({l.shape, l.dtype});
  Op op;
  TensorSpec out;
  try {
    op = normalize(raw, specs);
    out = infer(op, specs);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("{} ({})", e.what(), operand_text(inputs)));
  }
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    if (!(inputs[i].mesh == inputs[0].mesh)) {
      fail(ErrorKind::kInvalidArgument, "{}: operands are on different meshes ({})",
           to_string(op.type), operand_text(inputs));
    }
  }
  const DeviceMesh& mesh = inputs[0].mesh;
  const DimLabels labels = dim_labels(op, specs);
  const std::vector<DimChoice> choices = dim_choices(labels, specs);
  const int dims = ndim(mesh);
  // Redistribution cost of operand i to placements p, memoised (many strategies share them).
  std::vector<std::map<std::vector<Placement>, std::optional<double>>> memo(inputs.size());
  auto cost = [&](std::size_t i, const Layout& to) -> std::optional<double> {
    auto [it, fresh] = memo[i].try_emplace(to.placements);
    if (!fresh) return it->second;
    if (to == inputs[i]) return it->second = 0.0;
    try {
      return it->second = plan_redistribute(inputs[i], to, options).est_s;
    } catch (const Error&) {  // e.g. Shard -> Partial: not a strategy for this operand
      return it->second = std::nullopt;
    }
  };
  std::vector<Strategy> result;
  std::vector<std::size_t> pick(static_cast<std::size_t>(dims), 0);
  while (true) {
    std::vector<std::vector<Placement>> in_p(inputs.size(), std::vector<Placement>(dims));
    std::vector<Placement> out_p(dims);
    for (int m = 0; m < dims; ++m) {
      const DimChoice& c = choices[pick[static_cast<std::size_t>(m)]];
      for (std::size_t i = 0; i < inputs.size(); ++i) in_p[i][m] = c.inputs[i];
      out_p[m] = c.output;
    }
    try {
      Strategy s{{}, make_layout(mesh, out_p, out.shape, out.dtype), 0};
      bool valid = true;
      for (std::size_t i = 0; i < inputs.size() && valid; ++i) {
        s.inputs.push_back(make_layout(mesh, in_p[i], inputs[i].shape, inputs[i].dtype));
        const std::optional<double> c = cost(i, s.inputs.back());
        valid = c.has_value();
        if (valid) s.cost_s += *c;
      }
      if (valid) result.push_back(std::move(s));
    } catch (const Error&) {
      // an invalid layout (an integer P(avg)): not a strategy
    }
    int m = dims - 1;
    while (m >= 0 && ++pick[static_cast<std::size_t>(m)] == choices.size())
      pick[static_cast<std::size_t>(m--)] = 0;
    if (m < 0) break;
  }
  MESHFLOW_CHECK(!result.empty(), "{}: no strategy (all-Replicate is always one)", to_string(op));
  return result;
}

Strategy choose_strategy(const Op& op, const std::vector<Layout>& inputs,
                         const PlanOptions& options) {
  std::vector<Strategy> all = strategies(op, inputs, options);
  auto sharded = [](const Strategy& s) {
    std::int64_t d = shard_degree(s.output);
    for (const Layout& l : s.inputs) d += shard_degree(l);
    return d;
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < all.size(); ++i) {
    const double a = all[i].cost_s, b = all[best].cost_s;
    const double tolerance = 1e-9 * std::max(std::abs(a), std::abs(b));
    if (a < b - tolerance || (std::abs(a - b) <= tolerance && sharded(all[i]) > sharded(all[best])))
      best = i;
  }
  return std::move(all[best]);
}

std::size_t StrategyCache::KeyHash::operator()(const Key& k) const {
  std::size_t h = hash_value(k.op);
  for (const Layout& l : k.inputs) h = h * 31 + hash_value(l);
  return h;
}

std::shared_ptr<const Strategy> StrategyCache::get(const Op& op,
                                                   const std::vector<Layout>& inputs) {
  Key key{op, inputs};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  auto s = std::make_shared<const Strategy>(choose_strategy(op, inputs, options_));
  std::lock_guard lock(mu_);
  return entries_.try_emplace(std::move(key), std::move(s)).first->second;
}

}  // namespace meshflow
