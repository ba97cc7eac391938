// The row loops split over the device's threads: the forward pass (VectorMath::norm_rows, one
// pass per row after the first's moments; kernels/norm_rows.h for its precision); the gradients
// read the statistics the forward pass kept, so each reads its rows once: the scale's
// (VectorMath::norm_grad_w) and the input's (VectorMath::norm_grad_x, its sums, then its output,
// which sums the next row's alongside).
#include "meshflow/kernels/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow {

namespace {

// Rows [first, last) of the forward pass (kernels/norm_rows.h), or their statistics alone.
void forward_range(const float* x, const float* w, const float* b, float* y, float* stats,
                   std::int64_t first, std::int64_t last, std::int64_t d, float eps) {
  vector_math().norm_rows(x + first * d, w, b, y ? y + first * d : nullptr,
                          stats ? stats + first * kNormStatsFloats : nullptr, last - first, d, eps);
}

// sum += Σ over rows [first, last) of g x̂, and with `bias` bias += Σ of g, in row order.
void grad_w_range(const float* g, const float* x, const float* stats, float* sum, float* bias,
                  std::int64_t first, std::int64_t last, std::int64_t d) {
  vector_math().norm_grad_w(x + first * d, g + first * d, stats + first * kNormStatsFloats,
                            last - first, sum, bias, d);
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
    forward_range(x, nullptr, nullptr, nullptr, stats, first, last, d, eps);
  });
}

void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, const float* stats,
                            float* gx, std::int64_t rows, std::int64_t d) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    vector_math().norm_grad_x(g + first * d, x + first * d, w, stats + first * kNormStatsFloats,
                              gx + first * d, last - first, d);
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
