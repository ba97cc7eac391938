// The candidate planners and the choice between them. See transitions.h for the state machine
// every collective plan walks.
#include "meshflow/plan/planner.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/plan/point_to_point.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

// Appends the step for the valid move `kind` on `dims` taking `state` to `next`.
void push_move(std::vector<Step>& steps, const Layout& from, std::vector<Placement>& state,
               const std::vector<Placement>& next, std::vector<MeshDim> dims,
               const MachineModel& machine) {
  std::sort(dims.begin(), dims.end());
  const Layout before = with_placements(from, state);
  auto kind = classify_move(before, next, dims);
  MESHFLOW_CHECK(kind.has_value(), "invalid move {} -> {} on mesh {}", to_string(state),
                 to_string(next), to_string(from.mesh));
  steps.push_back(make_step(before, Move{*kind, dims, next}, machine));
  state = next;
}

// Steps `choice` (an odometer over universe[dims[i]]) to its next combination; returns false
// after the last one.
bool advance(std::vector<std::size_t>& choice, const std::vector<MeshDim>& dims,
             const std::vector<std::vector<Placement>>& universe) {
  for (std::size_t i = dims.size(); i-- > 0;) {
    if (++choice[i] < universe[dims[i]].size()) return true;
    choice[i] = 0;
  }
  return false;
}

bool shards_on_inner(const Layout& l, const std::vector<Placement>& s, MeshDim m, int d) {
  for (std::size_t k = m + 1; k < s.size(); ++k) {
    if (l.mesh.shape[k] > 1 && s[k] == Placement::shard(d)) return true;
  }
  return false;
}

}  // namespace

std::vector<Step> plan_per_dim(const Layout& from, const Layout& to, const MachineModel& machine) {
  const int k = ndim(from.mesh);
  std::vector<Placement> s = settle_unit_dims(from.mesh, from.placements, to.placements);
  const auto& t = to.placements;
  // The mesh dims to release: those that change, plus inner dims sharding a tensor dim that an
  // outer changing dim shards now or will shard (invariant 1 needs them out of the way).
  std::vector<bool> release(k, false);
  for (int m = 0; m < k; ++m) release[m] = !(s[m] == t[m]);
  // Release too: inner dims sharding a tensor dim that a released dim shards now or will shard
  // (invariant 1), and inner Partial dims whose op cannot be reduced across (invariant 4).
  for (bool grew = true; grew;) {
    grew = false;
    for (int m = 0; m < k; ++m) {
      if (!release[m]) continue;
      for (int m2 = m + 1; m2 < k; ++m2) {
        if (release[m2] || from.mesh.shape[m2] == 1) continue;
        const bool nested = s[m2].is_shard() && (s[m] == s[m2] || t[m] == s[m2]);
        const bool mixed =
            s[m].is_partial() && s[m2].is_partial() && !compatible_ops(s[m].op, s[m2].op);
        if (nested || mixed) release[m2] = grew = true;
      }
    }
  }
  // A released dim may go straight to its target shard S(d) only if no outer dim still to be
  // released will shard d now or later (it would then need this dim out of the way again).
  auto outer_pending = [&](int m, int d) {
    for (int m2 = 0; m2 < m; ++m2) {
      if (release[m2] && from.mesh.shape[m2] > 1 && !(s[m2] == t[m2]) &&
          (s[m2] == Placement::shard(d) || t[m2] == Placement::shard(d))) {
        return true;
      }
    }
    return false;
  };
  std::vector<Step> steps;
  // Phase A, inner to outer: everything released loses its shard / partial.
  for (int m = k - 1; m >= 0; --m) {
    if (!release[m] || s[m].is_replicate()) continue;
    std::vector<Placement> next = s;
    next[m] = Placement::replicate();
    if (!(s[m] == t[m]) && t[m].is_shard() && !shards_on_inner(from, s, m, t[m].dim) &&
        !outer_pending(m, t[m].dim)) {
      if (s[m].is_partial()) next[m] = t[m];  // reduce_scatter straight to the target shard
      if (s[m].is_shard() && !shards_on_inner(from, s, m, s[m].dim)) next[m] = t[m];  // all_to_all
    }
    if (!classify_move(with_placements(from, s), next, {m})) next[m] = Placement::replicate();
    push_move(steps, from, s, next, {m}, machine);
  }
  // Phase B, outer to inner: replicated dims take their targets locally.
  for (int m = 0; m < k; ++m) {
    if (s[m] == t[m]) continue;
    std::vector<Placement> next = s;
    next[m] = t[m];
    push_move(steps, from, s, next, {m}, machine);
  }
  MESHFLOW_CHECK(s == settle_unit_dims(from.mesh, t, t), "per_dim ended at {}", to_string(s));
  return steps;
}

std::vector<Step> merge_steps(const Layout& from, const std::vector<Step>& steps,
                              const MachineModel& machine) {
  std::vector<Step> out;
  for (const Step& s : steps) {
    if (!out.empty()) {
      const Step& last = out.back();
      std::vector<MeshDim> dims = last.mesh_dims;
      dims.insert(dims.end(), s.mesh_dims.begin(), s.mesh_dims.end());
      std::sort(dims.begin(), dims.end());
      const bool disjoint = std::adjacent_find(dims.begin(), dims.end()) == dims.end();
      if (last.kind == s.kind && s.kind != StepKind::kAllToAll && disjoint) {
        const Layout before = with_placements(from, last.before);
        if (classify_move(before, s.after, dims) == s.kind) {
          out.back() = make_step(before, Move{s.kind, dims, s.after}, machine);
          continue;
        }
      }
    }
    out.push_back(s);
  }
  return out;
}

std::vector<Step> plan_search(const Layout& from, const Layout& to, const MachineModel& machine) {
  const int k = ndim(from.mesh);
  const std::vector<Placement> start = settle_unit_dims(from.mesh, from.placements, to.placements);
  const std::vector<Placement>& goal = settle_unit_dims(from.mesh, to.placements, to.placements);
  // Placements each mesh dim may take: its start, its goal, R, and every shard in either.
  std::set<int> shard_dims;
  for (int m = 0; m < k; ++m) {
    if (from.placements[m].is_shard()) shard_dims.insert(from.placements[m].dim);
    if (to.placements[m].is_shard()) shard_dims.insert(to.placements[m].dim);
  }
  std::vector<std::vector<Placement>> universe(k);
  for (int m = 0; m < k; ++m) {
    auto& u = universe[m];
    u.push_back(start[m]);
    if (from.mesh.shape[m] == 1) continue;
    auto add = [&](const Placement& p) {
      if (std::find(u.begin(), u.end(), p) == u.end()) u.push_back(p);
    };
    add(goal[m]);
    add(Placement::replicate());
    for (int d : shard_dims) add(Placement::shard(d));
  }
  // Dijkstra; ties broken by fewer steps, then by the order states were found (deterministic).
  struct Entry {
    double cost;
    int steps;
    std::int64_t order;
    std::vector<Placement> state;
    bool operator>(const Entry& o) const {
      if (cost != o.cost) return cost > o.cost;
      if (steps != o.steps) return steps > o.steps;
      return order > o.order;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  std::map<std::vector<Placement>, std::pair<double, int>> best;
  std::map<std::vector<Placement>, std::pair<std::vector<Placement>, Step>> parent;
  std::int64_t order = 0;
  queue.push({0, 0, order++, start});
  best[start] = {0, 0};
  std::set<std::vector<Placement>> done;
  while (!queue.empty()) {
    Entry e = queue.top();
    queue.pop();
    if (done.contains(e.state)) continue;
    done.insert(e.state);
    if (e.state == goal) break;
    const Layout before = with_placements(from, e.state);
    // Moves on every non-empty subset of mesh dims, each dim to each placement of its universe.
    for (int mask = 1; mask < (1 << k); ++mask) {
      std::vector<MeshDim> dims;
      for (int m = 0; m < k; ++m) {
        if (mask & (1 << m)) dims.push_back(m);
      }
      std::vector<std::size_t> choice(dims.size(), 0);
      do {
        std::vector<Placement> next = e.state;
        bool changes_all = true;
        for (std::size_t i = 0; i < dims.size(); ++i) {
          next[dims[i]] = universe[dims[i]][choice[i]];
          changes_all = changes_all && !(next[dims[i]] == e.state[dims[i]]);
        }
        // R -> P only toward the goal.
        bool allowed = changes_all;
        for (MeshDim m : dims) {
          if (next[m].is_partial() && !e.state[m].is_partial() && !(next[m] == goal[m]))
            allowed = false;
        }
        if (allowed) {
          if (auto kind = classify_move(before, next, dims)) {
            Step step = make_step(before, Move{*kind, dims, next}, machine);
            const double cost = e.cost + step.est_s;
            auto it = best.find(next);
            if (it == best.end() || cost < it->second.first ||
                (cost == it->second.first && e.steps + 1 < it->second.second)) {
              best[next] = {cost, e.steps + 1};
              parent.insert_or_assign(next, std::pair{e.state, step});
              queue.push({cost, e.steps + 1, order++, next});
            }
          }
        }
      } while (advance(choice, dims, universe));
    }
  }
  MESHFLOW_CHECK(best.contains(goal), "search found no path {} -> {}", to_string(start),
                 to_string(goal));
  std::vector<Step> steps;
  for (std::vector<Placement> s = goal; s != start;) {
    const auto& [prev, step] = parent.at(s);
    steps.push_back(step);
    s = prev;
  }
  std::reverse(steps.begin(), steps.end());
  return steps;
}

namespace {

double total_est(const std::vector<Step>& steps) {
  double t = 0;
  for (const Step& s : steps) t += s.est_s;
  return t;
}

}  // namespace

Plan plan_redistribute(const Layout& from, const Layout& to, const PlanOptions& options) {
  check_redistributable(from, to);
  const MachineModel& machine = options.machine ? *options.machine : default_machine();
  struct Candidate {
    std::string name;
    std::vector<Step> steps;
  };
  std::vector<Candidate> candidates;
  const bool same_mesh = from.mesh == to.mesh;
  if (same_mesh) {
    std::vector<Step> per_dim = plan_per_dim(from, to, machine);
    candidates.push_back({"per_dim", per_dim});
    candidates.push_back({"per_dim_merged", merge_steps(from, per_dim, machine)});
    candidates.push_back({"search", plan_search(from, to, machine)});
  }
  const std::int64_t pairs = static_cast<std::int64_t>(size(from.mesh)) * size(to.mesh);
  if (!same_mesh || pairs <= options.max_point_to_point_pairs) {
    candidates.push_back({"point_to_point", {plan_point_to_point(from, to, machine)}});
  }
  Plan plan{.from = from, .to = to};
  std::size_t winner = 0;
  std::vector<std::int64_t> totals;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    totals.push_back(fill_totals(from, candidates[i].steps));
    // A later candidate wins only if strictly cheaper (by more than rounding).
    if (total_est(candidates[i].steps) < total_est(candidates[winner].steps) * (1 - 1e-9))
      winner = i;
  }
  plan.planner = candidates[winner].name;
  plan.steps = candidates[winner].steps;
  plan.est_s = total_est(plan.steps);
  plan.total_bytes = totals[winner];
  plan.min_bytes = min_bytes(from, to);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i == winner) continue;
    plan.alternatives.push_back({candidates[i].name, total_est(candidates[i].steps), totals[i],
                                 static_cast<int>(candidates[i].steps.size())});
  }
  return plan;
}

}  // namespace meshflow
