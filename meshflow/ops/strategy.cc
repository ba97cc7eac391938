#include "meshflow/ops/strategy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "meshflow/core/error.h"
#include "meshflow/ops/view.h"
#include "meshflow/ops/vocab_parallel.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

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
    } else if (contains(l.statistics, label)) {
      // reduced through all-reduced statistics (the lowered steps): the result is whole
    } else {  // summed away: each device holds a term of the reduction
      c.output = Placement::partial(l.reduce);
      // additive operands without the label (a bias) become terms too
      if (l.reduce == ReduceOp::kSum)
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
      // A reshape's shards map only where reshape_keeps_shards says so (ops/view.h).
      if (valid && op.type == OpType::kReshape) valid = reshape_keeps_shards(s.inputs[0], s.output);
      // A strategy that shards a statistics label runs lowered: its steps' moves are its price.
      if (valid && needs_lowering(op, s.inputs)) {
        const Lowering low = lower(op, s.inputs, options);
        // On a mesh dim of one device every placement holds the same numbers (the planner
        // settles such a dim for free): the steps may end in R where the strategy says P(sum).
        const Layout& last = low.steps.back().layout;
        MESHFLOW_CHECK(last.mesh == s.output.mesh && last.shape == s.output.shape &&
                           last.dtype == s.output.dtype &&
                           settle_unit_dims(last.mesh, last.placements, s.output.placements) ==
                               s.output.placements,
                       "{}: lowered to {} for {}", to_string(op), to_string(last),
                       to_string(s.output));
        s.cost_s += low.cost_s;
      }
      if (valid) result.push_back(std::move(s));
    } catch (const Error& e) {
      // an invalid layout (an integer P(avg)) is not a strategy; a broken invariant is a bug
      if (e.kind() == ErrorKind::kInternal) throw;
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
                         const PlanOptions& options, const std::optional<ResultTarget>& target) {
  std::vector<Strategy> all = strategies(op, inputs, options);
  if (target) {
    MESHFLOW_CHECK(target->placements.size() == all[0].output.placements.size(), "{}",
                   to_string(op));
    // A result that cannot reach the target (Shard -> Partial) is priced out, not dropped: a
    // pin the planner refuses is copy insertion's error to report. (The largest finite double,
    // not infinity, so the tie tolerance below stays a number.)
    std::map<std::vector<Placement>, double> memo;
    for (Strategy& s : all) {
      std::vector<Placement> want = target->placements;
      for (std::size_t m = 0; m < want.size(); ++m) {
        if (target->keep_partial && want[m].is_replicate() && s.output.placements[m].is_partial())
          want[m] = s.output.placements[m];
      }
      auto [it, fresh] = memo.try_emplace(s.output.placements, 0.0);
      if (fresh && s.output.placements != want) {
        const Layout to = make_layout(s.output.mesh, want, s.output.shape, s.output.dtype);
        try {
          it->second = plan_redistribute(s.output, to, options).est_s;
        } catch (const Error&) {
          it->second = std::numeric_limits<double>::max();
        }
      }
      s.cost_s += it->second;
    }
  }
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
  if (k.target) h = h * 31 + k.target->placements.size() + (k.target->keep_partial ? 7 : 0);
  return h;
}

std::shared_ptr<const Strategy> StrategyCache::get(const Op& op, const std::vector<Layout>& inputs,
                                                   const std::optional<ResultTarget>& target) {
  Key key{op, inputs, target};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  auto s = std::make_shared<const Strategy>(choose_strategy(op, inputs, options_, target));
  std::lock_guard lock(mu_);
  return entries_.try_emplace(std::move(key), std::move(s)).first->second;
}

}  // namespace meshflow
