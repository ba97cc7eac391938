// The row loops: in the forward pass a row's statistics by one vector reduction, then its output
// in one pass that also sums the next row's moments (VectorMath::norm_affine); the gradients read
// the statistics the forward pass kept, so each reads its rows once (the scale's) or twice (the
// input's: its sums, then its output, built per vector unit, kernels/vectorize.h).
#include "meshflow/kernels/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

namespace {

// A row's statistics about a shift c: mean = c + offset, so x - mean = (x - c) - offset. x - c is
// exact where x is near c (Sterbenz), so x̂ keeps float's precision relative to the row's spread
// whatever its mean; x - mean with mean rounded to float would lose log2(|mean| / spread) bits.
struct RowStats {
  float shift = 0, offset = 0, rstd = 0;
};

// The moments are summed about c in one pass over the row: offset = Σd / n and
// var = Σd² / n - offset², d = x - c. That difference cancels in float as offset² outgrows var,
// so c is the mean of the row's first kShiftFloats values: by Cauchy-Schwarz over those k
// values, offset² <= (n / k) var, so the difference's rounding, about ε (var + 2 offset²), stays
// within (1 + 2n / k) ε of var (17 ε for the GPT's rows of 512). A shift of 0 (the textbook
// one-pass formula) would lose all of var's precision on a row of mean 1e4 and spread 1.
constexpr std::int64_t kShiftFloats = 64;

float shift_of(const VectorMath& m, const float* x, std::int64_t d) {
  const std::int64_t k = std::min(d, kShiftFloats);
  return k == 0 ? 0.0f : m.sum(x, k) / static_cast<float>(k);
}

// The statistics from Σd and Σd² about c over d values.
RowStats stats_about(float c, float sum_d, float sum_sq, std::int64_t d, float eps) {
  const float n = static_cast<float>(d), offset = sum_d / n;
  const float var = std::max(sum_sq / n - offset * offset, 0.0f);
  return {c, offset, 1.0f / std::sqrt(var + eps)};
}

// x̂ = (x - c) rstd - offset rstd: one multiply-add after the exact x - c, where (x - c -
// offset) rstd takes three operations. -offset rstd is rounded once, and |offset| <= sqrt(n / k)
// spread (above), so it is at most 2.9 on the GPT's rows: x̂ keeps an absolute error of a few ε
// whatever the row's mean.
NormRow normalizer(const RowStats& s) { return {s.shift, s.rstd, -s.offset * s.rstd}; }

// Row r's statistics as kept in `stats`, and keeping them.
NormRow stats_row(const float* stats, std::int64_t r) {
  const float* s = stats + r * kNormStatsFloats;
  return {s[0], s[1], s[2]};
}

void keep(float* stats, std::int64_t r, NormRow row) {
  float* s = stats + r * kNormStatsFloats;
  s[0] = row.shift;
  s[1] = row.scale;
  s[2] = row.bias;
}

// The forward pass reads a row twice: its moments (one vector reduction), then its output. A row
// of 2 KiB is in L1 for the second pass, but the first waits on the row's reads from L2 or L3,
// and the statistics between the passes (horizontal sums, a division, a square root) wait on the
// first. On this machine's AMD EPYC, one pass after the other left the second pass's stores and
// the next row's reads unoverlapped, so the output pass sums the next row's moments inside this
// row's (VectorMath::norm_affine). Alone on one thread, over the bench GPT's [2048, 512], that
// took the forward pass from 139 to 106-116 us (a memcpy of x's 4 MiB: 65 us).
// No loop here prefetches the next row: the hardware's stream prefetcher keeps up with rows
// read one after another, and asking for the next row (or 2, 4, 8 rows ahead, into L1 or L2)
// measured 3-15% slower.
void forward_range(const float* x, const float* w, const float* b, float* y, float* stats,
                   std::int64_t first, std::int64_t last, std::int64_t d, float eps) {
  if (first == last) return;
  const VectorMath& m = vector_math();
  float c = shift_of(m, x + first * d, d);
  std::array<float, 2> sums = m.shifted_sums(x + first * d, c, d);
  for (std::int64_t r = first; r < last; ++r) {
    const NormRow row = normalizer(stats_about(c, sums[0], sums[1], d, eps));
    if (stats) keep(stats, r, row);
    const float* next = r + 1 < last ? x + (r + 1) * d : nullptr;
    c = next ? shift_of(m, next, d) : 0.0f;
    sums = m.norm_affine(x + r * d, row, w, b, y + r * d, next, c, d);
  }
}

void stats_range(const float* x, float* stats, std::int64_t first, std::int64_t last,
                 std::int64_t d, float eps) {
  const VectorMath& m = vector_math();
  for (std::int64_t r = first; r < last; ++r) {
    const float c = shift_of(m, x + r * d, d);
    const std::array<float, 2> sums = m.shifted_sums(x + r * d, c, d);
    keep(stats, r, normalizer(stats_about(c, sums[0], sums[1], d, eps)));
  }
}

// Two passes over a row: Σ g w and Σ g w x̂ (VectorMath::norm_grad_dots), then gx.
MESHFLOW_VECTOR_CLONES
void grad_x_range(const float* g, const float* x, const float* __restrict w, const float* stats,
                  float* gx, std::int64_t first, std::int64_t last, std::int64_t d) {
  const VectorMath& m = vector_math();
  const float n = static_cast<float>(d);
  for (std::int64_t r = first; r < last; ++r) {
    const float* __restrict xr = x + r * d;
    const float* __restrict gr = g + r * d;
    float* __restrict out = gx + r * d;
    const NormRow s = stats_row(stats, r);
    const auto [sum_gw, sum_gwx] = m.norm_grad_dots(xr, gr, w, s, d);
    const float m1 = sum_gw / n, m2 = sum_gwx / n;
    for (std::int64_t j = 0; j < d; ++j)
      out[j] = s.scale * (gr[j] * w[j] - m1 - ((xr[j] - s.shift) * s.scale + s.bias) * m2);
  }
}

// sum += Σ over rows [first, last) of g x̂, and with `bias` bias += Σ of g, in row order.
void grad_w_range(const float* g, const float* x, const float* stats, float* sum, float* bias,
                  std::int64_t first, std::int64_t last, std::int64_t d) {
  const VectorMath& m = vector_math();
  for (std::int64_t r = first; r < last; ++r)
    m.norm_grad_w(x + r * d, g + r * d, stats_row(stats, r), sum, bias, d);
}

// out = partial row 0 + partial row 1 + ..., in order.
void add_partials(const std::vector<float>& partial, std::int64_t parts, std::int64_t d,
                  float* out) {
  std::copy(partial.begin(), partial.begin() + d, out);
  for (std::int64_t p = 1; p < parts; ++p) add_to(out, partial.data() + p * d, d);
}

// gw (and with gb, the bias's gradient) summed in sum_rows' blocks of rows (`blocks` > 1), each
// into its own partial row, the blocks split over the device's threads.
void grad_w_blocks(const float* g, const float* x, const float* stats, float* gw, float* gb,
                   std::int64_t rows, std::int64_t d, std::int64_t blocks) {
  std::vector<float> pw(static_cast<std::size_t>(blocks * d), 0.0f);
  std::vector<float> pb(gb ? pw.size() : 0, 0.0f);
  parallel_for(blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const auto n = static_cast<int>(blocks), k = static_cast<int>(b);
      grad_w_range(g, x, stats, pw.data() + b * d, gb ? pb.data() + b * d : nullptr,
                   part_begin(rows, n, k, 1), part_begin(rows, n, k + 1, 1), d);
    }
  });
  add_partials(pw, blocks, d, gw);
  if (gb) add_partials(pb, blocks, d, gb);
}

}  // namespace

void layer_norm_rows(const float* x, const float* w, const float* b, float* y, float* stats,
                     std::int64_t rows, std::int64_t d, float eps) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    forward_range(x, w, b, y, stats, first, last, d, eps);
  });
}

void layer_norm_stats_rows(const float* x, float* stats, std::int64_t rows, std::int64_t d,
                           float eps) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    stats_range(x, stats, first, last, d, eps);
  });
}

void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, const float* stats,
                            float* gx, std::int64_t rows, std::int64_t d) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    grad_x_range(g, x, w, stats, gx, first, last, d);
  });
}

void layer_norm_grad_w_rows(const float* g, const float* x, const float* stats, float* gw,
                            std::int64_t rows, std::int64_t d) {
  if (const std::int64_t blocks = sum_rows_blocks(rows, d); blocks > 1) {
    grad_w_blocks(g, x, stats, gw, nullptr, rows, d, blocks);
    return;
  }
  // Each part sums its rows into its own row of `partial`; the parts are added in order.
  const int parts = parallel_parts(rows, row_grain(d));
  std::vector<float> partial(static_cast<std::size_t>(parts * d), 0.0f);
  parallel_parts_for(rows, parts, [&](int part, std::int64_t first, std::int64_t last) {
    grad_w_range(g, x, stats, partial.data() + part * d, nullptr, first, last, d);
  });
  add_partials(partial, parts, d, gw);
}

void layer_norm_grad_wb_rows(const float* g, const float* x, const float* stats, float* gw,
                             float* gb, std::int64_t rows, std::int64_t d) {
  const std::int64_t blocks = sum_rows_blocks(rows, d);
  if (blocks == 1) {  // sum_rows splits the columns: each alone
    layer_norm_grad_w_rows(g, x, stats, gw, rows, d);
    sum_rows(g, rows, d, gb);
    return;
  }
  grad_w_blocks(g, x, stats, gw, gb, rows, d, blocks);
}

}  // namespace meshflow
