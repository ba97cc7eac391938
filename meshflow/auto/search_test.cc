// The solver against exhaustive enumeration of the same problem: random small graphs (chains,
// series-parallel graphs, cliques), with and without a memory limit that excludes the
// unconstrained optimum, and for the least memory.
#include "meshflow/auto/search.h"

#include <gtest/gtest.h>

#include <random>

#include "meshflow/auto/search_testing.h"

namespace meshflow {
namespace {

using testing::exhaustive;
using Best = testing::Exhaustive;

ChoiceProblem random_problem(std::mt19937& rng, int vars,
                             const std::vector<std::pair<int, int>>& edges) {
  std::uniform_int_distribution<int> choices(1, 4);
  std::uniform_real_distribution<double> seconds(0.0, 1.0);
  std::uniform_int_distribution<std::int64_t> bytes(0, 1000);
  ChoiceProblem p;
  for (int v = 0; v < vars; ++v) {
    ChoiceProblem::Variable var{.name = "v" + std::to_string(v)};
    const int n = choices(rng);
    for (int c = 0; c < n; ++c) {
      var.seconds.push_back(seconds(rng));
      var.bytes.push_back(bytes(rng));
    }
    p.variables.push_back(var);
  }
  for (auto [a, b] : edges) {
    ChoiceProblem::Pair pair{.a = a, .b = b};
    pair.seconds.resize(p.variables[static_cast<std::size_t>(a)].seconds.size() *
                        p.variables[static_cast<std::size_t>(b)].seconds.size());
    for (double& s : pair.seconds) s = seconds(rng);
    p.pairs.push_back(pair);
  }
  return p;
}

// Graphs of up to 6 variables: a chain, a diamond with a residual edge (a block), two chains
// in parallel, a clique, parallel edges between one pair, and random edges.
std::vector<std::vector<std::pair<int, int>>> shapes(std::mt19937& rng) {
  std::vector<std::vector<std::pair<int, int>>> out = {
      {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}},
      {{0, 1}, {1, 2}, {1, 3}, {2, 4}, {3, 4}, {0, 4}, {4, 5}},
      {{0, 1}, {1, 5}, {0, 2}, {2, 3}, {3, 5}, {0, 4}, {4, 5}},
      {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}, {3, 4}, {4, 5}},
      {{0, 1}, {1, 0}, {1, 2}, {2, 1}, {3, 4}},
  };
  std::uniform_int_distribution<int> var(0, 5);
  std::vector<std::pair<int, int>> random;
  for (int k = 0; k < 8; ++k) {
    const int a = var(rng), b = var(rng);
    if (a != b) random.emplace_back(a, b);
  }
  out.push_back(random);
  return out;
}

void expect_matches(const ChoiceProblem& p, const SolveOptions& o) {
  const Best want = exhaustive(p, o);
  const std::optional<SearchResult> got = solve(p, o);
  ASSERT_EQ(got.has_value(), want.found);
  if (!got) {
    return;
  }
  EXPECT_TRUE(got->exact);
  const auto [s, b] = evaluate(p, got->choices);
  EXPECT_NEAR(s, got->seconds, 1e-12);
  EXPECT_EQ(b, got->bytes);
  if (o.minimise_bytes) {
    EXPECT_EQ(b, want.bytes);
  } else {
    EXPECT_NEAR(s, want.seconds, 1e-12);
  }
  if (o.memory_limit) {
    EXPECT_LE(b, *o.memory_limit);
  }
}

TEST(AutoshardSearch, EqualsExhaustiveEnumeration) {
  std::mt19937 rng(7);
  for (int round = 0; round < 60; ++round) {
    for (const auto& edges : shapes(rng)) {
      const ChoiceProblem p = random_problem(rng, 6, edges);
      SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(edges.size()) +
                   " pairs");
      expect_matches(p, {});
      expect_matches(p, {.minimise_bytes = true});
      // A limit between the least memory and the unconstrained optimum's excludes the optimum.
      const Best free = exhaustive(p, {});
      const Best least = exhaustive(p, {.minimise_bytes = true});
      if (least.bytes < free.bytes) {
        const std::int64_t limit = (least.bytes + free.bytes) / 2;
        expect_matches(p, {.memory_limit = limit});
        expect_matches(p, {.memory_limit = least.bytes});
      }
      expect_matches(p, {.memory_limit = least.bytes - 1});  // nothing fits
    }
  }
}

TEST(AutoshardSearch, HeuristicWhereTablesWouldGrowTooLarge) {
  // A clique of 6 variables with 4 choices: eliminating needs tables of 4^5 cells; with a
  // limit of 16 the solver fixes variables, says it is not exact, and still gives a valid,
  // costed choice no better than the optimum.
  std::mt19937 rng(3);
  std::vector<std::pair<int, int>> clique;
  for (int a = 0; a < 6; ++a)
    for (int b = a + 1; b < 6; ++b) clique.emplace_back(a, b);
  const ChoiceProblem p = random_problem(rng, 6, clique);
  const std::optional<SearchResult> r = solve(p, {.max_table = 16});
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->exact);
  EXPECT_NEAR(evaluate(p, r->choices).first, r->seconds, 1e-12);
  EXPECT_GE(r->seconds + 1e-12, exhaustive(p, {}).seconds);
}

TEST(AutoshardSearch, LongChain) {
  // 3,000 variables in a chain: every table stays over two variables. The optimum of a chain
  // with only pair costs 0 on the diagonal is the cheapest choice per variable, all equal.
  ChoiceProblem p;
  const int n = 3000;
  for (int v = 0; v < n; ++v)
    p.variables.push_back({.name = "v", .seconds = {2, 1, 3}, .bytes = {1, 1, 1}});
  for (int v = 0; v + 1 < n; ++v)
    p.pairs.push_back({.a = v, .b = v + 1, .seconds = {0, 5, 5, 5, 0, 5, 5, 5, 0}});
  const std::optional<SearchResult> r = solve(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->exact);
  EXPECT_DOUBLE_EQ(r->seconds, n * 1.0);
  for (int c : r->choices) EXPECT_EQ(c, 1);
}

}  // namespace
}  // namespace meshflow
