// Gradient rules as data: for a forward operator, the operators that compute each operand's
// gradient from the operands, the result and the result's gradient. The eager API (dtensor/)
// and the graph's backward pass (graph/) both interpret the same program, so every gradient
// rule is written once, in operators whose sharding rules ops/strategy.h already knows.
#pragma once

#include <optional>
#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

// A value a gradient step reads.
struct GradRef {
  enum class Kind { kInput, kOutput, kGrad, kStep };
  Kind kind = Kind::kGrad;
  int index = 0;  // operand index (kInput) or step index (kStep)
  bool operator==(const GradRef&) const = default;
};

struct GradStep {
  Op op;
  std::vector<GradRef> args;
};

// Invariants: a step reads only earlier steps; input_grads has one entry per operand, nullopt
// for an operand without a gradient (softmax_cross_entropy's integer labels).
struct GradProgram {
  std::vector<GradStep> steps;
  std::vector<std::optional<GradRef>> input_grads;
};

// Returns the gradient program of `op` applied to operands of `inputs` specs; throws Error for
// an operator that has none (the gradient operators themselves).
GradProgram gradient_program(const Op& op, const std::vector<TensorSpec>& inputs);

}  // namespace meshflow
