// Communication overlapped with the matrix product that consumes or produces it (nvFuser's
// collective permute in a host loop, XLA's collective matmul). A row product (ops/matmul.h:
// matmul, linear, matmul_grad_a) of an operand 0 sharded on dim 0 (the chunk rule over the
// group's ranks) is an all-gather then the product; decomposed, each device multiplies the block
// it already holds while the next block travels:
//   permute form: at step k (1 <= k < n) rank r sends its own block to (r - k) mod n and
//     receives the block of (r + k) mod n (DESIGN's permute rule): n - 1 collective permutes;
//   broadcast form: at step k rank k broadcasts its block: n broadcasts;
//   in-place form, where the group shares memory (threads): one all-gather of the blocks'
//     addresses, every block multiplied where it lies (nothing copied), then a barrier.
// A row product whose result is a Partial(sum) term per rank, reduce-scattered over dim 0 (the
// row-parallel linear), is decomposed the same way:
//   ring (form permute): at step k rank r computes its term of block b = (r + k + 1) mod n,
//     adds the partial sum received from r + 1 for b, and passes it to r - 1; after n steps it
//     holds block r (n - 1 permutes);
//   in-place form, where the group shares memory: one all-gather of the results' addresses,
//     then at step k rank r adds its term of block b straight into rank b's result (the
//     product accumulating there), a barrier between steps (n - 1): nothing copied, no
//     separate addition.
// Uneven blocks follow the chunk rule.
//
// Backward uses the same two loops: the gradient of a gathered operand is a reduce-scatter of
// its product's gradient (product_reduce_scatter of matmul_grad_a), and the gradient of a
// reduce-scattered result is gathered into the next product (allgather_product).
#pragma once

#include <span>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/tensor.h"
#include "meshflow/ops/op.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow {

// One block's transfer or product as it ran on this device, for traces (steady-clock seconds;
// a transfer ends when the device saw it complete).
struct OverlapEvent {
  enum class Kind { kTransfer, kProduct };
  Kind kind = Kind::kProduct;
  int block = 0;
  double start_s = 0, end_s = 0;
};

struct OverlapOptions {
  // allgather_product: permute, broadcast or in_place; product_reduce_scatter: permute (the
  // ring) or in_place.
  GatherForm form = GatherForm::kPermute;
  Tensor* gathered = nullptr;                   // allgather_product: set to the gathered operand 0
  std::vector<OverlapEvent>* events = nullptr;  // appended to when set
};

// Returns op(gather(a_local), rest...) whole on every rank of `group`: a_local is this rank's
// chunk (chunk(rows, n, rank)) of operand 0's dim 0, `rest` the other operands (b, and linear's
// bias), whole. float32 or float64.
Tensor allgather_product(Communicator& group, const Op& op, const Tensor& a_local,
                         std::int64_t rows, std::span<const Tensor* const> rest,
                         const OverlapOptions& options = {});

// Returns this rank's chunk of dim 0 of the sum over ranks of op(a_local, rest...), every
// rank's term being of the same shape.
Tensor product_reduce_scatter(Communicator& group, const Op& op, const Tensor& a_local,
                              std::span<const Tensor* const> rest,
                              const OverlapOptions& options = {});

}  // namespace meshflow
