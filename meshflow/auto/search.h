// The placement search's solver: a choice per variable minimising the sum of per-choice and
// pairwise seconds, with the sum of per-choice bytes within a limit. Pure: no model, no mesh.
//
// Exact variable elimination: a variable is eliminated by combining every table that names it
// into one over its neighbours, keeping for each assignment of those neighbours the Pareto front
// of (seconds, bytes) over its choices. A chain eliminates end first and a series-parallel graph
// (an MLP, a transformer block with its residuals) by series and parallel reductions, so every
// table stays over at most two variables. Invariants, from one elimination to the next:
//   - every live table's cells hold (seconds, bytes) fronts: no entry is dominated by another of
//     its cell, each sorted by seconds, none above the memory limit (bytes only grow);
//   - each entry's derivation names the choices of the variables eliminated into it, so the
//     winning entry gives every variable's choice.
// Exactness is lost (SearchResult::exact false) only where a table would exceed
// SolveOptions::max_table cells (a graph far from series-parallel): the variable with the most
// neighbours is then fixed to its cheapest choice alone and elimination goes on; or where a
// cell's front exceeds max_front entries (the cheapest ones are kept).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshflow {

struct ChoiceProblem {
  struct Variable {
    std::string name;
    std::vector<double> seconds;      // per choice
    std::vector<std::int64_t> bytes;  // per choice, >= 0
  };
  // Seconds of each pair of choices of variables a and b (a != b), a's choice major:
  // seconds[i * b_choices + j].
  struct Pair {
    int a = 0, b = 0;
    std::vector<double> seconds;
  };
  std::vector<Variable> variables;
  std::vector<Pair> pairs;
};

struct SolveOptions {
  std::optional<std::int64_t> memory_limit;  // the sum of the chosen bytes must not exceed it
  bool minimise_bytes = false;               // least bytes first, then least seconds
  std::int64_t max_table = std::int64_t{1} << 22;
  int max_front = 48;
};

struct SearchResult {
  std::vector<int> choices;  // per variable
  double seconds = 0;
  std::int64_t bytes = 0;
  bool exact = true;
};

// Returns the best choice, or nullopt when no choice meets the memory limit. Throws Error when
// the problem is malformed (a variable without choices, a table of the wrong size).
std::optional<SearchResult> solve(const ChoiceProblem& problem, const SolveOptions& options = {});

// Returns the seconds and bytes of `choices` (a choice per variable).
std::pair<double, std::int64_t> evaluate(const ChoiceProblem& problem,
                                         const std::vector<int>& choices);

}  // namespace meshflow
