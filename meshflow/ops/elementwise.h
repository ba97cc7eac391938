// Elementwise operators: add, sub, mul, div with NumPy broadcasting; neg, relu, gelu (erf form),
// tanh, sigmoid, exp; and the gradients of the non-linear ones. Kernels are loops over contiguous
// memory (the innermost dim of a broadcast runs with unit strides, so the compiler vectorises it).
#pragma once

#include <vector>

#include "meshflow/ops/op.h"

namespace meshflow {

// Returns the NumPy broadcast of `a` and `b` (aligned at the last dim; a dim of 1 stretches);
// throws Error(kShapeMismatch) naming `what` and both shapes when they do not fit.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what);

bool is_binary(OpType type);      // add, sub, mul, div
bool is_unary(OpType type);       // neg, relu, gelu, tanh, sigmoid, exp
bool is_unary_grad(OpType type);  // relu_grad, gelu_grad, tanh_grad, sigmoid_grad

TensorSpec infer_elementwise(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor elementwise_kernel(const Op& op, const std::vector<const Tensor*>& in);

// The family's sharding rule (op.h's DimLabels) for a result of shape `out`.
DimLabels elementwise_labels(const Op& op, const std::vector<TensorSpec>& inputs, const Shape& out);

}  // namespace meshflow
