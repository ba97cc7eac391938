// Gradient accumulation over micro-batches: a shard added into a running sum, and the sum
// scaled into a mean. Memory-bound loops over tensors of one shape and floating-point dtype.
#pragma once

#include "meshflow/core/tensor.h"

namespace meshflow {

// sum += x, elementwise (the same shape and floating-point dtype).
void add_into(Tensor& sum, const Tensor& x);

// sum[i] += x[i] for i < n (float32, built per vector unit).
void add_to(float* sum, const float* x, std::int64_t n);

// t *= s, elementwise (floating point).
void scale_in_place(Tensor& t, double s);

// out[j] = Σ over r of x[r * cols + j] for j < cols: the rows of a [rows, cols] array added into
// one (a bias's or a broadcast operand's gradient). The rows are summed in blocks whose bounds
// depend on the shape alone, each block in row order and the blocks' sums in block order,
// alone or with the blocks split over the device's threads, so the bits are the same.
template <typename T>
void sum_rows(const T* x, std::int64_t rows, std::int64_t cols, T* out);

// The blocks of rows sum_rows adds separately for a [rows, cols] array, a function of the shape
// alone: block b is rows [part_begin(rows, n, b, 1), part_begin(rows, n, b + 1, 1)) of n (each
// summed from 0 in row order, then the blocks' sums in block order). 1: sum_rows splits the
// columns over the threads instead, each summed in row order.
std::int64_t sum_rows_blocks(std::int64_t rows, std::int64_t cols);

}  // namespace meshflow
