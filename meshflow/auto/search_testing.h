// The auto tests' reference: every assignment of a choice problem enumerated, the best under a
// solve's rule (auto/search.h).
#pragma once

#include <limits>
#include <utility>

#include "meshflow/auto/search.h"

namespace meshflow::testing {

struct Exhaustive {
  double seconds = std::numeric_limits<double>::infinity();
  std::int64_t bytes = std::numeric_limits<std::int64_t>::max();
  bool found = false;  // some assignment meets the memory limit
};

// Every assignment of `p`, the best within `options.memory_limit`: least seconds (then bytes),
// or with `options.minimise_bytes` least bytes (then seconds).
inline Exhaustive exhaustive(const ChoiceProblem& p, const SolveOptions& options) {
  Exhaustive best;
  std::vector<int> c(p.variables.size(), 0);
  while (true) {
    const auto [s, b] = evaluate(p, c);
    if (!options.memory_limit || b <= *options.memory_limit) {
      const bool better = options.minimise_bytes
                              ? std::pair{static_cast<double>(b), s} <
                                    std::pair{static_cast<double>(best.bytes), best.seconds}
                              : std::pair{s, static_cast<double>(b)} <
                                    std::pair{best.seconds, static_cast<double>(best.bytes)};
      if (better) best = {s, b, true};
    }
    std::size_t k = 0;
    for (; k < c.size(); ++k) {
      if (++c[k] < static_cast<int>(p.variables[k].seconds.size())) break;
      c[k] = 0;
    }
    if (k == c.size()) break;
  }
  return best;
}

}  // namespace meshflow::testing
