// Megatron's vocabulary-parallel cross-entropy. softmax_cross_entropy (and its gradient) cannot
// run on logits whose class dim is sharded as they are: log Σ exp needs every class of a row.
// Rather than gathering the logits, a strategy that shards the classes lowers the operator into
// steps that each run on shards, so that only per-row statistics travel:
//
//   m     = logit_max(logits)                     [B]     a class shard gives P(max)
//   st    = logit_stats(logits, m, labels)         [B, 2]  (Σ_c exp(x - m), x[label]): P(sum)
//   loss  = cross_entropy_from_stats(m, st)        []      mean over B of m + log st0 - st1
//   dlogits = cross_entropy_grad_from_stats(logits, labels, m, st, g)
//                                                  [B, C]  g (exp(x - m) / st0 - onehot) / B
//
// m and st are pinned to the logits' batch shard and Replicate elsewhere, so a step moves one
// all-reduce of B numbers (the max) and one of 2B (the sums and the picked logits) per row
// shard. A shard's columns are the classes from its offset on (run_kernel's offsets): a row's
// label is picked only on the device that holds that column, and every device checks it
// against the global class count. Means divide by the global B, as softmax_cross_entropy's do.
#pragma once

#include <vector>

#include "meshflow/ops/op.h"
#include "meshflow/ops/strategy.h"

namespace meshflow {

// logit_max, logit_stats, cross_entropy_from_stats, cross_entropy_grad_from_stats: operators
// only the lowering makes (they have no gradient program).
bool is_vocab_parallel_family(OpType type);

TensorSpec infer_vocab_parallel(const Op& op, const std::vector<TensorSpec>& inputs);
// offsets (op.h): the logits' class offset gives the global class of local column 0.
Tensor vocab_parallel_kernel(const Op& op, const std::vector<const Tensor*>& in,
                             const std::vector<TensorSpec>& globals, const ShardOffsets& offsets);
DimLabels vocab_parallel_labels(const Op& op, const std::vector<TensorSpec>& inputs);

// One step of a lowered operator.
struct LoweredStep {
  Op op;
  // The step's operands: i < the operator's operand count is operand i (in the layout the
  // strategy reads it), otherwise step i - that count.
  std::vector<int> args;
  Strategy strategy;  // chosen on its operands' layouts, priced with its move to `layout`
  Layout layout;      // the value later steps read: its pin (the last step: its kernel's layout)
};

// Invariants: steps read only operands and earlier steps; the last step's layout is the
// strategy's result; cost_s sums the steps' costs (their operand and pin moves).
struct Lowering {
  std::vector<LoweredStep> steps;
  double cost_s = 0;
};

// Returns whether `op` (as normalize returns it) on operands laid out as `layouts` runs lowered:
// softmax_cross_entropy or its gradient whose logits shard the class dim over a mesh dim of
// more than one device.
bool needs_lowering(const Op& op, const std::vector<Layout>& layouts);

// Returns the lowering of `op` on operands in `layouts` (needs_lowering holds), each step's
// strategy chosen by choose_strategy with its pin as target. Pure and deterministic: the graph's
// pass, the DTensor API and the strategy's price all read the same steps.
Lowering lower(const Op& op, const std::vector<Layout>& layouts, const PlanOptions& options = {});

}  // namespace meshflow
