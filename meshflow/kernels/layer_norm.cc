// The row loops: statistics by vector reductions, then one fused pass over the row, each range
// of rows built per vector unit (kernels/vectorize.h).
#include "meshflow/kernels/layer_norm.h"

#include <cmath>
#include <vector>

#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

namespace {

struct RowStats {
  float mean = 0, rstd = 0;
};

// Asks for the row after this one while this one is computed (its rows are in cache by then:
// each row takes several passes, and only the first would otherwise wait on memory).
void prefetch_row(const float* p, std::int64_t d) {
  for (std::int64_t j = 0; j < d; j += 64 / sizeof(float)) __builtin_prefetch(p + j);
}

// Returns 1 / sqrt(var + eps) from the row's Σ (x - mean)² over d values.
float rstd_of(float sq_dev, std::int64_t d, float eps) {
  return 1.0f / std::sqrt(sq_dev / static_cast<float>(d) + eps);
}

RowStats row_stats(const VectorMath& m, const float* x, std::int64_t d, float eps) {
  const float mean = m.sum(x, d) / static_cast<float>(d);
  return {mean, rstd_of(m.sum_sq_dev(x, mean, d), d, eps)};
}

MESHFLOW_VECTOR_CLONES
void forward_range(const float* x, const float* __restrict w, const float* __restrict b,
                   float* __restrict y, std::int64_t first, std::int64_t last, std::int64_t d,
                   float eps) {
  const VectorMath& m = vector_math();
  for (std::int64_t r = first; r < last; ++r) {
    const float* __restrict xr = x + r * d;
    float* __restrict yr = y + r * d;
    if (r + 1 < last) prefetch_row(xr + d, d);
    const RowStats s = row_stats(m, xr, d, eps);
    for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - s.mean) * s.rstd * w[j] + b[j];
  }
}

// Three passes over a row: its mean, then its squared deviations with Σ g w and Σ g w x
// (VectorMath::norm_grad_sums), then gx.
MESHFLOW_VECTOR_CLONES
void grad_x_range(const float* g, const float* x, const float* __restrict w, float* gx,
                  std::int64_t first, std::int64_t last, std::int64_t d, float eps) {
  const VectorMath& m = vector_math();
  const float n = static_cast<float>(d);
  for (std::int64_t r = first; r < last; ++r) {
    const float* __restrict xr = x + r * d;
    const float* __restrict gr = g + r * d;
    float* __restrict out = gx + r * d;
    if (r + 1 < last) {
      prefetch_row(xr + d, d);
      prefetch_row(gr + d, d);
    }
    const float mean = m.sum(xr, d) / n;
    const auto [sq_dev, sum_gw, sum_gwx] = m.norm_grad_sums(xr, gr, w, mean, d);
    const float rstd = rstd_of(sq_dev, d, eps);
    const float m1 = sum_gw / n;
    // mean(g w x̂) = rstd (Σ g w x - mean Σ g w) / d
    const float m2 = rstd * (sum_gwx - mean * sum_gw) / n;
    const float c = rstd * m2;
    for (std::int64_t j = 0; j < d; ++j) out[j] = rstd * (gr[j] * w[j] - m1 - (xr[j] - mean) * c);
  }
}

// sum[j] += Σ over the rows of g x̂.
MESHFLOW_VECTOR_CLONES
void grad_w_range(const float* g, const float* x, float* __restrict sum, std::int64_t first,
                  std::int64_t last, std::int64_t d, float eps) {
  const VectorMath& m = vector_math();
  for (std::int64_t r = first; r < last; ++r) {
    const float* __restrict xr = x + r * d;
    const float* __restrict gr = g + r * d;
    if (r + 1 < last) {
      prefetch_row(xr + d, d);
      prefetch_row(gr + d, d);
    }
    const RowStats s = row_stats(m, xr, d, eps);
    for (std::int64_t j = 0; j < d; ++j) sum[j] += gr[j] * ((xr[j] - s.mean) * s.rstd);
  }
}

}  // namespace

void layer_norm_rows(const float* x, const float* w, const float* b, float* y, std::int64_t rows,
                     std::int64_t d, float eps) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    forward_range(x, w, b, y, first, last, d, eps);
  });
}

void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, float* gx,
                            std::int64_t rows, std::int64_t d, float eps) {
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    grad_x_range(g, x, w, gx, first, last, d, eps);
  });
}

void layer_norm_grad_w_rows(const float* g, const float* x, float* gw, std::int64_t rows,
                            std::int64_t d, float eps) {
  // Each part sums its rows into its own row of `partial`; the parts are added in order.
  const int parts = parallel_parts(rows, row_grain(d));
  std::vector<float> partial(static_cast<std::size_t>(parts * d), 0.0f);
  parallel_parts_for(rows, parts, [&](int part, std::int64_t first, std::int64_t last) {
    grad_w_range(g, x, partial.data() + part * d, first, last, d, eps);
  });
  for (std::int64_t j = 0; j < d; ++j) gw[j] = partial[static_cast<std::size_t>(j)];
  for (int part = 1; part < parts; ++part)
    for (std::int64_t j = 0; j < d; ++j) gw[j] += partial[static_cast<std::size_t>(part * d + j)];
}

}  // namespace meshflow
