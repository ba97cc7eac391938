// Comparing tensors: bit-exact, or within a tolerance where floating-point sums demand it.
#pragma once

#include <optional>
#include <string>

#include "meshflow/core/tensor.h"

namespace meshflow {

// Returns nullopt when `a` and `b` have the same dtype, shape and bits; otherwise a one-line
// description of the first difference (dtype, shape, or flat index and both values).
std::optional<std::string> compare_exact(const Tensor& a, const Tensor& b);

// Returns nullopt when dtype and shape match and |a - b| <= atol + rtol * |b| element-wise
// (integers compare exactly); otherwise a description of the worst element.
std::optional<std::string> compare_close(const Tensor& a, const Tensor& b, double rtol,
                                         double atol);

// Returns the largest |a - b| over elements (0 for empty tensors); a and b must have one dtype
// and shape (an internal check).
double max_abs_difference(const Tensor& a, const Tensor& b);

}  // namespace meshflow
