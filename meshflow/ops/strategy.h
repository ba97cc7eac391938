// Sharding propagation, as pure functions of layouts: for an operator and its operands' layouts,
// every valid strategy (the layouts the operands are brought to -> the result's layout) and the
// cheapest one under plan/'s cost model, counting the redistributions the operands need; ties
// keep the most data sharded.
//
// An operator states its rule once, in its family's file, as dim labels (op.h's DimLabels):
// dims of operands and result that carry the same label index the same elements. Per mesh dim,
// the valid placements are then
//   - every operand and the result Replicate;
//   - Shard a label: every operand dim with it S(dim) (broadcast dims and operands without it
//     R); the result S(its dim), or P(sum) when the label is summed away (matmul's k, a
//     reduction's dims, a loss's batch), with the additive operands P(sum) as well;
//   - Partial(op) for op in sum and avg, by linearity: additive operators (add, sub, neg, sum,
//     mean) take every term Partial(op) (a Replicate term is divided by n, or kept for avg, by
//     the R->P redistribution); multiplicative ones (mul, div's numerator, matmul, the gradient
//     operators in their incoming gradient) take one factor Partial(op) and the others
//     Replicate, with no division. Partial(max/min), P·P and every non-linear operator reduce
//     first (their only strategies take Replicate or Shard operands).
// A label summed away by a max (logit_max) gives Partial(max) instead. Labels listed
// unshardable (softmax's dim) are never sharded: strategies gather them. A statistics label (a
// loss's class dim) shards with the result whole over it: the operator then runs lowered
// (ops/vocab_parallel.h), and its steps' moves are added to the strategy's cost. A reshape keeps
// only the strategies whose shards map exactly (ops/view.h).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

struct Strategy {
  std::vector<Layout> inputs;  // the layouts the operands are redistributed to
  Layout output;
  double cost_s = 0;  // estimated seconds of those redistributions, summed
};

// Returns "S(0),R + R,S(1) -> S(0),S(1)  cost 1.2e-05 s".
std::string to_text(const Strategy& strategy);

// Returns every valid strategy, in a fixed order, with its cost. Throws Error naming the
// operator and the operand layouts when the operands are on different meshes, or when their
// shapes or dtypes do not fit the operator.
std::vector<Strategy> strategies(const Op& op, const std::vector<Layout>& inputs,
                                 const PlanOptions& options = {});

// Where a result is headed: a pin it will be moved to, or the layout a gradient should land in.
struct ResultTarget {
  std::vector<Placement> placements;
  // A Partial result is left as it is on mesh dims the target replicates (a gradient's partial
  // sums are reduced once, after every contribution is added).
  bool keep_partial = false;
  bool operator==(const ResultTarget&) const = default;
};

// Returns the cheapest strategy (ties: the most shard degree over result and operands, then the
// first in strategies' order). Deterministic. With `target`, each result is also priced by its
// move to the target, and Strategy::cost_s includes that move.
Strategy choose_strategy(const Op& op, const std::vector<Layout>& inputs,
                         const PlanOptions& options = {},
                         const std::optional<ResultTarget>& target = std::nullopt);

// choose_strategy cached by (op, operand layouts): a repeated operator costs one hash lookup.
// Thread-safe.
class StrategyCache {
 public:
  explicit StrategyCache(PlanOptions options = {}) : options_(options) {}
  std::shared_ptr<const Strategy> get(const Op& op, const std::vector<Layout>& inputs,
                                      const std::optional<ResultTarget>& target = std::nullopt);

 private:
  struct Key {
    Op op;
    std::vector<Layout> inputs;
    std::optional<ResultTarget> target;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  PlanOptions options_;
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Strategy>, KeyHash> entries_;
};

}  // namespace meshflow
