// Layer norm's forward row loop and its statistics, written once over one instruction set's
// loops (kernels/vector_math_simd.h's SimdLoops, the scalar ones in vector_math.cc), so that
// the per-row work between the passes (the shift, the statistics, the next pass) inlines into
// the loop: through VectorMath's pointers, one call per row (NormRow passed through the stack),
// layer norm's forward pass ran 13% slower alone on [2048, 512].
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "meshflow/kernels/vector_math.h"

namespace meshflow {

// A row's statistics are its moments about a shift c: offset = Σd / n and var = Σd² / n -
// offset², d = x - c, summed in one pass over the row. That difference cancels in float as
// offset² outgrows var, so c is the mean of the row's first kShiftFloats values: by
// Cauchy-Schwarz over those k values, offset² <= (n / k) var, so the difference's rounding,
// about ε (var + 2 offset²), stays within (1 + 2n / k) ε of var (17 ε for the GPT's rows of
// 512). A shift of 0 (the textbook one-pass formula) would lose all of var's precision on a row
// of mean 1e4 and spread 1. x - c is exact where x is near c (Sterbenz), so x̂ keeps float's
// precision relative to the row's spread whatever its mean; x - mean with mean rounded to float
// would lose log2(|mean| / spread) bits.
inline constexpr std::int64_t kShiftFloats = 64;

// The floats a row's statistics take where they are kept: NormRow's shift, scale and bias.
inline constexpr std::int64_t kNormStatsFloats = 3;

// The statistics from Σd and Σd² about c over n values as x̂ = (x - c) rstd - offset rstd: one
// multiply-add after the exact x - c, where (x - c - offset) rstd takes three operations.
// -offset rstd is rounded once, and |offset| <= sqrt(n / k) spread (above), so it is at most
// 2.9 on the GPT's rows: x̂ keeps an absolute error of a few ε whatever the row's mean.
inline NormRow norm_row(float c, float sum_d, float sum_sq, std::int64_t n, float eps) {
  const float count = static_cast<float>(n), offset = sum_d / count;
  const float var = std::max(sum_sq / count - offset * offset, 0.0f);
  const float rstd = 1.0f / std::sqrt(var + eps);
  return {c, rstd, -offset * rstd};
}

// The forward pass reads a row twice: its moments (one vector reduction), then its output. A row
// of 2 KiB is in L1 for the second pass, but the first waits on the row's reads from L2 or L3,
// and the statistics between the passes (horizontal sums, a division, a square root) wait on the
// first. On this machine's AMD EPYC, one pass after the other left the second pass's stores and
// the next row's reads unoverlapped, so the output pass sums the next row's moments inside this
// row's. Alone on one thread, over the bench GPT's [2048, 512], that took the forward pass from
// 139 to 106-116 us (a memcpy of x's 4 MiB: 65 us); the row loop inside each instruction set's
// code (no call per row) and a tree for the horizontal sums then took it to 80-90 us.
// No loop here prefetches the next row: the hardware's stream prefetcher keeps up with rows
// read one after another, and asking for the next row (or 2, 4, 8 rows ahead, into L1 or L2)
// measured 3-15% slower.
//
// Layer norm over rows [0, rows) of [rows, n]: each row's statistics into stats (unless null,
// kNormStatsFloats a row) and, with y, y = x̂ w + b. `L` gives sum(x, n), shifted_sums(x, c, n)
// and norm_affine(x, row, w, b, y, next, next_c, n) (output and the next row's moments in one
// pass); the statistics are the same bits with y or without.
template <class L>
void norm_rows_with(const float* x, const float* w, const float* b, float* y, float* stats,
                    std::int64_t rows, std::int64_t n, float eps) {
  if (rows == 0) return;
  const std::int64_t k = std::min(n, kShiftFloats);
  const auto shift_of = [&](const float* row) {
    return k == 0 ? 0.0f : L::sum(row, k) / static_cast<float>(k);
  };
  float c = shift_of(x);
  std::array<float, 2> sums = L::shifted_sums(x, c, n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const NormRow row = norm_row(c, sums[0], sums[1], n, eps);
    if (stats) {
      float* s = stats + r * kNormStatsFloats;
      s[0] = row.shift;
      s[1] = row.scale;
      s[2] = row.bias;
    }
    const float* next = r + 1 < rows ? x + (r + 1) * n : nullptr;
    c = next ? shift_of(next) : 0.0f;
    if (y) {
      sums = L::norm_affine(x + r * n, row, w, b, y + r * n, next, c, n);
    } else if (next) {
      sums = L::shifted_sums(next, c, n);
    }
  }
}

}  // namespace meshflow
