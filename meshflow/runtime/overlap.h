// Communication overlapped with the GEMM that consumes or produces it (nvFuser's collective
// permute in a host loop, XLA's collective matmul). A row-sharded x (the chunk rule over the
// group's ranks) times a w every device holds is an all-gather then a GEMM; decomposed, each
// device multiplies the block it already holds while the next block travels:
//   permute form: at step k (1 <= k < n) rank r sends its own block to (r - k) mod n and
//     receives the block of (r + k) mod n (DESIGN's permute rule): n - 1 collective permutes;
//   broadcast form: at step k rank k broadcasts its block: n broadcasts.
// The row-parallel form, a K-sharded x times a K-sharded w giving row blocks of the sum, is a
// reduce-scatter decomposed the same way: at step k rank r multiplies its rows of block
// b = (r + k + 1) mod n, adds the partial sum received from r + 1 for b, and passes it to
// r - 1; after n steps it holds block r. Uneven blocks follow the chunk rule.
#pragma once

#include "meshflow/comm/communicator.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

enum class GatherForm { kPermute, kBroadcast };

// Returns x @ w, [rows, N], on every rank of `group`: x_local is this rank's row block
// (chunk(rows, n, rank)) of x [rows, K], w [K, N] is whole on every rank. float32 or float64.
Tensor allgather_matmul(Communicator& group, const Tensor& x_local, std::int64_t rows,
                        const Tensor& w, GatherForm form);

// Returns this rank's row block (chunk(M, n, rank)) of sum over ranks of x_r @ w_r, where
// x_local [M, K_r] and w_local [K_r, N] are this rank's column and row blocks of x and w.
Tensor matmul_reduce_scatter(Communicator& group, const Tensor& x_local, const Tensor& w_local);

}  // namespace meshflow
