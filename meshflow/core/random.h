// Seeded random fill: reproducible, non-trivial test and benchmark data.
#pragma once

#include <array>
#include <cstdint>

#include "meshflow/core/tensor.h"

namespace meshflow {

// Fills `tensor` with values drawn from a generator seeded by `seed`: floats uniform in [-1, 1),
// integers uniform in [-1000, 1000]. The same seed, dtype and shape give the same bits.
void fill_random(Tensor& tensor, std::uint64_t seed);

// Returns a new tensor of `dtype` and `shape` filled by fill_random(seed).
Tensor random_tensor(DType dtype, const Shape& shape, std::uint64_t seed);

// Returns Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") of
// `counter` under `key`: four 32-bit words, the same on every platform.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

}  // namespace meshflow
