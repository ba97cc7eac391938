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

namespace {

// The placements each mesh dim may take during the search: its start, its goal, R, and every
// shard of a tensor dim sharded at the start or the goal. Size-1 dims keep their (settled) start.
std::vector<std::vector<Placement>> search_universe(const Layout& from, const Layout& to,
                                                    const std::vector<Placement>& start,
                                                    const std::vector<Placement>& goal) {
  const int k = ndim(from.mesh);
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
  return universe;
}

// Calls fn(next, step) for every valid move from `state`: every non-empty subset of the mesh
// dims of size > 1, each dim to each placement of its universe (R -> P only toward the goal).
template <typename Fn>
void for_each_move(const Layout& from, const std::vector<Placement>& state,
                   const std::vector<Placement>& goal,
                   const std::vector<std::vector<Placement>>& universe, const MachineModel& machine,
                   Fn fn) {
  std::vector<MeshDim> movable;
  for (int m = 0; m < ndim(from.mesh); ++m) {
    if (from.mesh.shape[m] > 1) movable.push_back(m);
  }
  const Layout before = with_placements(from, state);
  for (std::uint32_t mask = 1; mask < (1u << movable.size()); ++mask) {
    std::vector<MeshDim> dims;
    for (std::size_t i = 0; i < movable.size(); ++i) {
      if (mask & (1u << i)) dims.push_back(movable[i]);
    }
    std::vector<std::size_t> choice(dims.size(), 0);
    do {
      std::vector<Placement> next = state;
      bool allowed = true;
      for (std::size_t i = 0; i < dims.size(); ++i) {
        next[dims[i]] = universe[dims[i]][choice[i]];
        allowed = allowed && !(next[dims[i]] == state[dims[i]]);
        if (next[dims[i]].is_partial() && !state[dims[i]].is_partial() &&
            !(next[dims[i]] == goal[dims[i]]))
          allowed = false;
      }
      if (!allowed) continue;
      if (auto kind = classify_move(before, next, dims))
        fn(next, make_step(before, Move{*kind, dims, next}, machine));
    } while (advance(choice, dims, universe));
  }
}

}  // namespace

std::vector<Step> plan_search(const Layout& from, const Layout& to, const MachineModel& machine) {
  const std::vector<Placement> start = settle_unit_dims(from.mesh, from.placements, to.placements);
  const std::vector<Placement> goal = settle_unit_dims(from.mesh, to.placements, to.placements);
  const auto universe = search_universe(from, to, start, goal);
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
  std::set<std::vector<Placement>> done;
  std::int64_t order = 0;
  queue.push({0, 0, order++, start});
  best[start] = {0, 0};
  while (!queue.empty()) {
    Entry e = queue.top();
    queue.pop();
    if (!done.insert(e.state).second) continue;
    if (e.state == goal) break;
    for_each_move(from, e.state, goal, universe, machine,
                  [&](const std::vector<Placement>& next, Step step) {
                    const double cost = e.cost + step.est_s;
                    auto it = best.find(next);
                    if (it != best.end() && !(cost < it->second.first) &&
                        !(cost == it->second.first && e.steps + 1 < it->second.second))
                      return;
                    best[next] = {cost, e.steps + 1};
                    parent.insert_or_assign(next, std::pair{e.state, std::move(step)});
                    queue.push({cost, e.steps + 1, order++, next});
                  });
  }
  MESHFLOW_CHECK(best.contains(goal), "search found no path {} -> {}", to_string(start),
                 to_string(goal));
  // Walk the parents back from the goal.
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

// Estimates closer than this (relative) are a tie, which the earlier candidate wins: floating-
// point rounding must not decide between equal plans.
constexpr double kTieTolerance = 1e-9;

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
  // The collective candidates price shards by the mesh's shape alone: they work on copies of
  // the layouts without the device list, which every intermediate state would copy again (on
  // 65,536 devices, a quarter of a megabyte per state).
  auto shape_only = [](const Layout& l) {  // copies all but the device list
    return Layout{.mesh = {.shape = l.mesh.shape, .names = l.mesh.names},
                  .placements = l.placements,
                  .shape = l.shape,
                  .dtype = l.dtype};
  };
  const Layout from_shape = shape_only(from), to_shape = shape_only(to);
  if (same_mesh) {
    std::vector<Step> per_dim = plan_per_dim(from_shape, to_shape, machine);
    candidates.push_back({"per_dim", per_dim});
    candidates.push_back({"per_dim_merged", merge_steps(from_shape, per_dim, machine)});
    int movable = 0;
    for (std::int64_t e : from.mesh.shape) movable += e > 1 ? 1 : 0;
    if (movable <= options.max_search_mesh_dims)
      candidates.push_back({"search", plan_search(from_shape, to_shape, machine)});
  }
  // On one mesh the exchange is priced by the shape alone too; across meshes the devices say
  // which destinations hold part of the source.
  candidates.push_back({"point_to_point",
                        {same_mesh ? plan_point_to_point(from_shape, to_shape, machine)
                                   : plan_point_to_point(from, to, machine)}});
  Plan plan{.from = from, .to = to};
  std::size_t winner = 0;
  std::vector<std::int64_t> totals;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    totals.push_back(fill_totals(from_shape, candidates[i].steps));
    // A later candidate wins only if strictly cheaper (by more than rounding).
    if (total_est(candidates[i].steps) < total_est(candidates[winner].steps) * (1 - kTieTolerance))
      winner = i;
  }
  plan.planner = candidates[winner].name;
  plan.steps = candidates[winner].steps;
  plan.est_s = total_est(plan.steps);
  plan.total_bytes = totals[winner];
  plan.min_bytes = same_mesh ? min_bytes(from_shape, to_shape) : min_bytes(from, to);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i == winner) continue;
    plan.alternatives.push_back({candidates[i].name, total_est(candidates[i].steps), totals[i],
                                 static_cast<int>(candidates[i].steps.size())});
  }
  return plan;
}

}  // namespace meshflow
