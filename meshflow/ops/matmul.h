// Matrix products: matmul (a[..., m, k] @ b[k, n]), linear (x[..., in] @ w[in, out] + b[out]) and
// the two gradient products, all through OpenBLAS's cblas_sgemm / cblas_dgemm on the tensors'
// own memory (leading dims fold into the row count, so a batched left operand is one GEMM and
// nothing is copied).
#pragma once

#include <vector>

#include "meshflow/kernels/gemm.h"
#include "meshflow/ops/op.h"

namespace meshflow {

bool is_matmul_family(OpType type);  // matmul, linear, matmul_grad_a, matmul_grad_b

TensorSpec infer_matmul(const Op& op, const std::vector<TensorSpec>& inputs);
Tensor matmul_kernel(const Op& op, const std::vector<const Tensor*>& in);

// sum += the product of `in` (the GEMM's beta = 1: no temporary, no second pass); `sum` has the
// result's shape and dtype.
void matmul_kernel_accumulate(const Op& op, const std::vector<const Tensor*>& in, Tensor& sum);

// The products whose every result row comes from the same row of operand 0 alone (matmul,
// linear, matmul_grad_a; leading dims fold into rows): any m rows of operand 0 give those m rows
// of the result. The decomposed collectives (runtime/overlap.h) run them a block at a time.
bool is_row_product(OpType type);

// Returns the width of a row product's result row, given operand 1's shape b.
std::int64_t row_product_width(const Op& op, const Shape& b);

// Writes m rows of row product `op`'s result to `out` (row_product_width wide), or adds them
// to what `out` holds when `accumulate`, from m rows of operand 0 at `a` (a_width wide),
// operand 1 `b` whole and linear's `bias` (or nullptr). float32 and float64.
template <typename T>
void row_product(const Op& op, const T* a, std::int64_t m, std::int64_t a_width, const Tensor& b,
                 const Tensor* bias, T* out, bool accumulate = false);

// The family's sharding rule (op.h's DimLabels) for a result of shape `out`.
DimLabels matmul_labels(const Op& op, const std::vector<TensorSpec>& inputs, const Shape& out);

}  // namespace meshflow
