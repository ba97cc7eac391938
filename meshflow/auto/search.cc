// Variable elimination over (seconds, bytes) fronts (auto/search.h states the invariants).
#include "meshflow/auto/search.h"

#include <algorithm>
#include <limits>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

// How an entry came to be: `var` chosen as `choice` (var -1: nothing chosen) over the entries
// `children` derived.
struct Derivation {
  int var = -1;
  int choice = 0;
  std::vector<int> children;
};

struct Entry {
  double seconds = 0;
  std::int64_t bytes = 0;
  int derivation = -1;  // -1: a table's own entry, nothing eliminated into it
};
using Front = std::vector<Entry>;

// A table over `scope` (sorted variables): a front per assignment, scope[0]'s choice major.
struct Table {
  std::vector<int> scope;
  std::vector<Front> cells;
  bool live = true;
};

// An entry being formed: its sums and the derivations it combines.
struct Pending {
  double seconds = 0;
  std::int64_t bytes = 0;
  int choice = 0;
  std::vector<int> children;
};

class Solver {
 public:
  Solver(const ChoiceProblem& problem, const SolveOptions& options)
      : problem_(problem), options_(options) {
    const std::size_t n = problem.variables.size();
    domain_.resize(n);
    var_tables_.resize(n);
    for (std::size_t v = 0; v < n; ++v) {
      const auto& var = problem.variables[v];
      MESHFLOW_CHECK(!var.seconds.empty(), "autoshard search: variable \"{}\" has no choice",
                     var.name);
      MESHFLOW_CHECK(var.bytes.size() == var.seconds.size(),
                     "autoshard search: variable \"{}\" has bytes for {} of its {} choices",
                     var.name, var.bytes.size(), var.seconds.size());
      domain_[v] = static_cast<int>(var.seconds.size());
      Table t{.scope = {static_cast<int>(v)}};
      for (std::size_t c = 0; c < var.seconds.size(); ++c)
        t.cells.push_back({Entry{var.seconds[c], var.bytes[c], -1}});
      add_table(std::move(t));
    }
    for (const auto& p : problem.pairs) {
      MESHFLOW_CHECK(p.a != p.b && p.a >= 0 && p.b >= 0 && static_cast<std::size_t>(p.a) < n &&
                         static_cast<std::size_t>(p.b) < n,
                     "autoshard search: a pair names a variable twice or one out of range");
      const std::size_t na = static_cast<std::size_t>(domain_[static_cast<std::size_t>(p.a)]);
      const std::size_t nb = static_cast<std::size_t>(domain_[static_cast<std::size_t>(p.b)]);
      MESHFLOW_CHECK(p.seconds.size() == na * nb,
                     "autoshard search: a pair table of {} cells for {} pairs of choices",
                     p.seconds.size(), na * nb);
      Table t{.scope = {std::min(p.a, p.b), std::max(p.a, p.b)}};
      t.cells.resize(na * nb);
      for (std::size_t i = 0; i < na; ++i) {
        for (std::size_t j = 0; j < nb; ++j) {
          // Scope order is (min, max): transpose where a > b.
          const std::size_t cell = p.a < p.b ? i * nb + j : j * na + i;
          t.cells[cell] = {Entry{p.seconds[i * nb + j], 0, -1}};
        }
      }
      add_table(std::move(t));
    }
  }

  std::optional<SearchResult> run() {
    const std::size_t n = domain_.size();
    std::vector<bool> done(n, false);
    // The size of the table eliminating each variable makes; only a removed variable's
    // neighbours change theirs.
    std::vector<std::int64_t> size(n);
    for (std::size_t v = 0; v < n; ++v) size[v] = cells_without(static_cast<int>(v));
    for (std::size_t left = n; left > 0; --left) {
      int best = -1;
      for (std::size_t v = 0; v < n; ++v)
        if (!done[v] && (best < 0 || size[v] < size[static_cast<std::size_t>(best)]))
          best = static_cast<int>(v);
      const bool too_large = size[static_cast<std::size_t>(best)] > options_.max_table;
      if (too_large) {
        exact_ = false;
        best = most_connected(done);
      }
      const std::vector<int> around = neighbours(best);
      if (too_large) {
        fix(best);  // removes it from every table; its choice becomes a scalar table
      } else {
        eliminate(best);
      }
      done[static_cast<std::size_t>(best)] = true;
      for (int u : around) size[static_cast<std::size_t>(u)] = cells_without(u);
    }
    // Only scalar tables are left: combine them.
    std::vector<Pending> all{Pending{}};
    for (const Table& t : tables_) {
      if (!t.live) continue;
      MESHFLOW_CHECK(t.scope.empty(), "autoshard search: a table outlived its variables");
      all = combine(all, t.cells[0]);
    }
    if (all.empty()) return std::nullopt;
    SearchResult r{.choices = std::vector<int>(n, 0),
                   .seconds = all[0].seconds,
                   .bytes = all[0].bytes,
                   .exact = exact_};
    std::vector<int> stack = all[0].children;
    while (!stack.empty()) {
      const Derivation& d = derivations_[static_cast<std::size_t>(stack.back())];
      stack.pop_back();
      if (d.var >= 0) r.choices[static_cast<std::size_t>(d.var)] = d.choice;
      stack.insert(stack.end(), d.children.begin(), d.children.end());
    }
    return r;
  }

 private:
  void add_table(Table t) {
    const int id = static_cast<int>(tables_.size());
    for (int v : t.scope) var_tables_[static_cast<std::size_t>(v)].push_back(id);
    tables_.push_back(std::move(t));
  }

  std::vector<int> live_tables(int v) const {
    std::vector<int> out;
    for (int t : var_tables_[static_cast<std::size_t>(v)])
      if (tables_[static_cast<std::size_t>(t)].live) out.push_back(t);
    return out;
  }

  // The variables v's tables name beside v, sorted.
  std::vector<int> neighbours(int v) const {
    std::vector<int> out;
    for (int t : live_tables(v))
      for (int u : tables_[static_cast<std::size_t>(t)].scope)
        if (u != v) out.push_back(u);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // The cells of the table eliminating v makes (saturating above max_table).
  std::int64_t cells_without(int v) const {
    std::int64_t size = 1;
    for (int u : neighbours(v)) {
      size *= domain_[static_cast<std::size_t>(u)];
      if (size > options_.max_table) return options_.max_table + 1;
    }
    return size;
  }

  int most_connected(const std::vector<bool>& done) const {
    int best = -1;
    std::size_t most = 0;
    for (std::size_t v = 0; v < done.size(); ++v) {
      if (done[v]) continue;
      const std::size_t k = neighbours(static_cast<int>(v)).size();
      if (best < 0 || k > most) best = static_cast<int>(v), most = k;
    }
    return best;
  }

  // Returns (key, tie-break) of the order entries are ranked by.
  std::pair<double, double> rank(double seconds, std::int64_t bytes) const {
    return options_.minimise_bytes ? std::pair{static_cast<double>(bytes), seconds}
                                   : std::pair{seconds, static_cast<double>(bytes)};
  }

  // Keeps the front of `p`: within the limit, undominated, best first; one entry where the
  // limit does not matter.
  void prune(std::vector<Pending>& p) {
    if (options_.memory_limit) {
      std::erase_if(p, [&](const Pending& e) { return e.bytes > *options_.memory_limit; });
    }
    std::sort(p.begin(), p.end(), [&](const Pending& x, const Pending& y) {
      return rank(x.seconds, x.bytes) < rank(y.seconds, y.bytes);
    });
    if (!options_.memory_limit || options_.minimise_bytes) {
      if (p.size() > 1) p.resize(1);
      return;
    }
    std::vector<Pending> kept;
    for (Pending& e : p)
      if (kept.empty() || e.bytes < kept.back().bytes) kept.push_back(std::move(e));
    if (kept.size() > static_cast<std::size_t>(options_.max_front)) {
      exact_ = false;
      Pending smallest = std::move(kept.back());
      kept.resize(static_cast<std::size_t>(options_.max_front) - 1);
      kept.push_back(std::move(smallest));
    }
    p = std::move(kept);
  }

  std::vector<Pending> combine(const std::vector<Pending>& a, const Front& b) {
    std::vector<Pending> out;
    out.reserve(a.size() * b.size());
    for (const Pending& x : a) {
      for (const Entry& y : b) {
        Pending z{.seconds = x.seconds + y.seconds, .bytes = x.bytes + y.bytes, .choice = x.choice};
        z.children = x.children;
        if (y.derivation >= 0) z.children.push_back(y.derivation);
        out.push_back(std::move(z));
      }
    }
    prune(out);
    return out;
  }

  // The cell of table t for the choices in `value` (indexed by variable).
  std::size_t cell_of(const Table& t, const std::vector<int>& value) const {
    std::size_t cell = 0;
    for (int u : t.scope)
      cell = cell * static_cast<std::size_t>(domain_[static_cast<std::size_t>(u)]) +
             static_cast<std::size_t>(value[static_cast<std::size_t>(u)]);
    return cell;
  }

  Front finish(std::vector<Pending>& front, int var) {
    prune(front);
    Front out;
    for (Pending& p : front) {
      derivations_.push_back({.var = var, .choice = p.choice, .children = std::move(p.children)});
      out.push_back({p.seconds, p.bytes, static_cast<int>(derivations_.size()) - 1});
    }
    return out;
  }

  void eliminate(int v) {
    const std::vector<int> tabs = live_tables(v);
    Table out{.scope = neighbours(v)};
    std::vector<int> value(domain_.size(), 0);
    std::size_t cells = 1;
    for (int u : out.scope) cells *= static_cast<std::size_t>(domain_[static_cast<std::size_t>(u)]);
    out.cells.resize(cells);
    const bool single = !options_.memory_limit || options_.minimise_bytes;
    for (std::size_t cell = 0; cell < cells; ++cell) {
      // Decode the cell into the neighbours' choices (last scope variable minor).
      std::size_t rest = cell;
      for (std::size_t k = out.scope.size(); k-- > 0;) {
        const auto d = static_cast<std::size_t>(domain_[static_cast<std::size_t>(out.scope[k])]);
        value[static_cast<std::size_t>(out.scope[k])] = static_cast<int>(rest % d);
        rest /= d;
      }
      if (single) {
        out.cells[cell] = eliminate_single(v, tabs, value);
        continue;
      }
      std::vector<Pending> front;
      for (int c = 0; c < domain_[static_cast<std::size_t>(v)]; ++c) {
        value[static_cast<std::size_t>(v)] = c;
        std::vector<Pending> sum{Pending{.choice = c}};
        for (int t : tabs) {
          const Table& table = tables_[static_cast<std::size_t>(t)];
          sum = combine(sum, table.cells[cell_of(table, value)]);
          if (sum.empty()) break;
        }
        for (Pending& p : sum) front.push_back(std::move(p));
      }
      out.cells[cell] = finish(front, v);
    }
    for (int t : tabs) retire(t);
    add_table(std::move(out));
  }

  // eliminate()'s cell where every front holds one entry (no memory limit): the best choice's
  // sums, without forming the fronts.
  Front eliminate_single(int v, const std::vector<int>& tabs, std::vector<int>& value) {
    int best = -1;
    std::pair<double, double> best_rank;
    double best_s = 0;
    std::int64_t best_b = 0;
    for (int c = 0; c < domain_[static_cast<std::size_t>(v)]; ++c) {
      value[static_cast<std::size_t>(v)] = c;
      double s = 0;
      std::int64_t b = 0;
      bool ok = true;
      for (int t : tabs) {
        const Table& table = tables_[static_cast<std::size_t>(t)];
        const Front& f = table.cells[cell_of(table, value)];
        if (f.empty()) {
          ok = false;
          break;
        }
        s += f[0].seconds;
        b += f[0].bytes;
      }
      if (!ok) continue;
      const auto r = rank(s, b);
      if (best < 0 || r < best_rank) best = c, best_rank = r, best_s = s, best_b = b;
    }
    if (best < 0) return {};
    value[static_cast<std::size_t>(v)] = best;
    Derivation d{.var = v, .choice = best};
    for (int t : tabs) {
      const Table& table = tables_[static_cast<std::size_t>(t)];
      const int child = table.cells[cell_of(table, value)][0].derivation;
      if (child >= 0) d.children.push_back(child);
    }
    derivations_.push_back(std::move(d));
    return {Entry{best_s, best_b, static_cast<int>(derivations_.size()) - 1}};
  }

  // Fixes v to its cheapest choice counted alone (its tables' best cells at that choice).
  void fix(int v) {
    const std::vector<int> tabs = live_tables(v);
    int best = 0;
    double best_s = std::numeric_limits<double>::infinity();
    for (int c = 0; c < domain_[static_cast<std::size_t>(v)]; ++c) {
      double s = 0;
      for (int t : tabs) {
        const Table& table = tables_[static_cast<std::size_t>(t)];
        const auto pos = static_cast<std::size_t>(
            std::find(table.scope.begin(), table.scope.end(), v) - table.scope.begin());
        double least = std::numeric_limits<double>::infinity();
        for (std::size_t cell = 0; cell < table.cells.size(); ++cell) {
          if (choice_at(table, cell, pos) != c || table.cells[cell].empty()) continue;
          least = std::min(least, table.cells[cell][0].seconds);
        }
        s += least;
      }
      if (s < best_s) best = c, best_s = s;
    }
    for (int t : tabs) {
      const Table& table = tables_[static_cast<std::size_t>(t)];
      const auto pos = static_cast<std::size_t>(
          std::find(table.scope.begin(), table.scope.end(), v) - table.scope.begin());
      Table sliced{.scope = table.scope};
      sliced.scope.erase(sliced.scope.begin() + static_cast<std::ptrdiff_t>(pos));
      for (std::size_t cell = 0; cell < table.cells.size(); ++cell)
        if (choice_at(table, cell, pos) == best) sliced.cells.push_back(table.cells[cell]);
      retire(t);
      add_table(std::move(sliced));
    }
    derivations_.push_back({.var = v, .choice = best});
    add_table({.cells = {Front{Entry{0, 0, static_cast<int>(derivations_.size()) - 1}}}});
  }

  int choice_at(const Table& t, std::size_t cell, std::size_t pos) const {
    for (std::size_t k = t.scope.size(); k-- > pos + 1;)
      cell /= static_cast<std::size_t>(domain_[static_cast<std::size_t>(t.scope[k])]);
    return static_cast<int>(
        cell % static_cast<std::size_t>(domain_[static_cast<std::size_t>(t.scope[pos])]));
  }

  void retire(int t) {
    Table& table = tables_[static_cast<std::size_t>(t)];
    table.live = false;
    table.cells = {};
  }

  const ChoiceProblem& problem_;
  const SolveOptions& options_;
  std::vector<int> domain_;
  std::vector<std::vector<int>> var_tables_;
  std::vector<Table> tables_;
  std::vector<Derivation> derivations_;
  bool exact_ = true;
};

}  // namespace

std::optional<SearchResult> solve(const ChoiceProblem& problem, const SolveOptions& options) {
  return Solver(problem, options).run();
}

std::pair<double, std::int64_t> evaluate(const ChoiceProblem& problem,
                                         const std::vector<int>& choices) {
  MESHFLOW_CHECK(choices.size() == problem.variables.size());
  double s = 0;
  std::int64_t b = 0;
  for (std::size_t v = 0; v < choices.size(); ++v) {
    const auto c = static_cast<std::size_t>(choices[v]);
    s += problem.variables[v].seconds.at(c);
    b += problem.variables[v].bytes.at(c);
  }
  for (const auto& p : problem.pairs) {
    const auto nb = problem.variables[static_cast<std::size_t>(p.b)].seconds.size();
    s += p.seconds.at(static_cast<std::size_t>(choices[static_cast<std::size_t>(p.a)]) * nb +
                      static_cast<std::size_t>(choices[static_cast<std::size_t>(p.b)]));
  }
  return {s, b};
}

}  // namespace meshflow
