// The row loops split over the device's threads: the forward pass (VectorMath::norm_rows, one
// pass per row after the first's moments; kernels/norm_rows.h for its precision); the gradients
// read the statistics the forward pass kept, so each reads its rows once (the scale's) or twice
// (the input's: its sums, then its output, built per vector unit, kernels/vectorize.h).
#include "meshflow/kernels/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/scratch.h"
#include "meshflow/kernels/vector_math.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

namespace {

// Row r's statistics as kept in `stats`.
NormRow stats_row(const float* stats, std::int64_t r) {
  const float* s = stats + r * kNormStatsFloats;
  return {s[0], s[1], s[2]};
}

// Rows [first, last) of the forward pass (kernels/norm_rows.h), or their statistics alone.
void forward_range(const float* x, const float* w, const float* b, float* y, float* stats,
                   std::int64_t first, std::int64_t last, std::int64_t d, float eps) {
  vector_math().norm_rows(x + first * d, w, b, y ? y + first * d : nullptr,
                          stats ? stats + first * kNormStatsFloats : nullptr, last - first, d, eps);
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
void add_partials(const ScratchVector<float>& partial, std::int64_t parts, std::int64_t d,
                  float* out) {
  std::copy(partial.begin(), partial.begin() + d, out);
  for (std::int64_t p = 1; p < parts; ++p) add_to(out, partial.data() + p * d, d);
}

// gw (and with gb, the bias's gradient) summed in sum_rows' blocks of rows (`blocks` > 1), each
// into its own partial row, the blocks split over the device's threads.
void grad_w_blocks(const float* g, const float* x, const float* stats, float* gw, float* gb,
                   std::int64_t rows, std::int64_t d, std::int64_t blocks) {
  ScratchVector<float> pw(static_cast<std::size_t>(blocks * d), 0.0f);
  ScratchVector<float> pb(gb ? pw.size() : 0, 0.0f);
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
    forward_range(x, nullptr, nullptr, nullptr, stats, first, last, d, eps);
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
  ScratchVector<float> partial(static_cast<std::size_t>(parts * d), 0.0f);
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
