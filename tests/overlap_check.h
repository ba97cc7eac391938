// The decomposed collective matmuls (runtime/overlap.h) checked on a backend: results against
// the single-device GEMM for uneven blocks, and each device's calls counted by the recording
// communicator (n - 1 permutes, or n broadcasts).
#pragma once

#include <vector>

#include "meshflow/comm/launch.h"

namespace meshflow::testing {

void check_allgather_matmul(Backend backend, const std::vector<int>& ranks);
void check_matmul_reduce_scatter(Backend backend, const std::vector<int>& ranks);

}  // namespace meshflow::testing
