// Gradient accumulation over micro-batches: a shard added into a running sum, and the sum
// scaled into a mean. Memory-bound loops over tensors of one shape and floating-point dtype.
#pragma once

#include "meshflow/core/tensor.h"

namespace meshflow {

// sum += x, elementwise (the same shape and floating-point dtype).
void add_into(Tensor& sum, const Tensor& x);

// t *= s, elementwise (floating point).
void scale_in_place(Tensor& t, double s);

}  // namespace meshflow
