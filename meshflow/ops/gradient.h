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

// Runs `program` over values of any kind (whole tensors here, DTensors in dtensor/): apply(op,
// args) computes one step from pointers to its arguments, copy(value) duplicates a result.
// Returns each operand's gradient, nullopt where it has none.
template <typename V, typename Apply, typename Copy>
std::vector<std::optional<V>> run_gradient_program(const GradProgram& program,
                                                   const std::vector<const V*>& operands,
                                                   const V& output, const V& grad, Apply apply,
                                                   Copy copy) {
  std::vector<V> steps;
  steps.reserve(program.steps.size());
  auto value = [&](const GradRef& r) -> const V& {
    switch (r.kind) {
      case GradRef::Kind::kInput:
        return *operands[static_cast<std::size_t>(r.index)];
      case GradRef::Kind::kOutput:
        return output;
      case GradRef::Kind::kGrad:
        return grad;
      case GradRef::Kind::kStep:
        break;
    }
    return steps[static_cast<std::size_t>(r.index)];
  };
  for (const GradStep& s : program.steps) {
    std::vector<const V*> args;
    for (const GradRef& r : s.args) args.push_back(&value(r));
    steps.push_back(apply(s.op, args));
  }
  std::vector<std::optional<V>> grads;
  for (const std::optional<GradRef>& g : program.input_grads) {
    if (g) {
      grads.emplace_back(copy(value(*g)));
    } else {
      grads.emplace_back(std::nullopt);
    }
  }
  return grads;
}

// The gradients of output = op(operands) on one device, whole tensors (the reference the
// distributed backward is compared with).
std::vector<std::optional<Tensor>> compute_backward(const Op& op,
                                                    const std::vector<const Tensor*>& operands,
                                                    const Tensor& output, const Tensor& grad);

}  // namespace meshflow
