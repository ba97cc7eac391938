// The decomposed collective products (runtime/overlap.h) checked on a backend: forward and
// backward results against single-device products for uneven blocks, and each device's calls
// counted by the recording communicator: a gather's n - 1 permutes, n broadcasts, or for the
// in-place form, run where devices share memory, one all-gather of addresses and a barrier; a
// reduce-scatter's n - 1 permutes (the ring), or in place one all-gather of addresses and n - 1
// barriers.
#pragma once

#include <vector>

#include "meshflow/comm/launch.h"

namespace meshflow::testing {

// Column-parallel linear with a row-sharded input: y = gather(x) @ w_local + b_local in
// every gather form (x 3-D, so rows fold), with the gathered x; backward dx = reduce-scatter of
// dy @ w_localᵀ, in every reduce-scatter form.
void check_allgather_product(Backend backend, const std::vector<int>& ranks);

// Row-parallel matmul (and linear, whose bias every rank's term carries): y's row block =
// reduce-scatter of x_local @ w_local in every form; backward dx_local = gather(dy) @ w_localᵀ
// in every gather form.
void check_product_reduce_scatter(Backend backend, const std::vector<int>& ranks);

}  // namespace meshflow::testing
