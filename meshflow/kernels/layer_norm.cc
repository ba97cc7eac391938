// The row loops: statistics by vector reductions, then one fused pass over the row.
#include "meshflow/kernels/layer_norm.h"

#include <cmath>
#include <vector>

#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow {

namespace {

struct RowStats {
  float mean = 0, rstd = 0;
};

RowStats row_stats(const VectorMath& m, const float* x, std::int64_t d, float eps) {
  const float n = static_cast<float>(d);
  const float mean = m.sum(x, d) / n;
  return {mean, 1.0f / std::sqrt(m.sum_sq_dev(x, mean, d) / n + eps)};
}

}  // namespace

void layer_norm_rows(const float* x, const float* w, const float* b, float* y, std::int64_t rows,
                     std::int64_t d, float eps) {
  const VectorMath& m = vector_math();
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t r = first; r < last; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      const RowStats s = row_stats(m, xr, d, eps);
      for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - s.mean) * s.rstd * w[j] + b[j];
    }
  });
}

void layer_norm_grad_x_rows(const float* g, const float* x, const float* w, float* gx,
                            std::int64_t rows, std::int64_t d, float eps) {
  const VectorMath& m = vector_math();
  const float n = static_cast<float>(d);
  parallel_for(rows, row_grain(d), [&](std::int64_t first, std::int64_t last) {
    std::vector<float> gw(static_cast<std::size_t>(d));
    for (std::int64_t r = first; r < last; ++r) {
      const float* xr = x + r * d;
      const float* gr = g + r * d;
      float* out = gx + r * d;
      const RowStats s = row_stats(m, xr, d, eps);
      for (std::int64_t j = 0; j < d; ++j) gw[static_cast<std::size_t>(j)] = gr[j] * w[j];
      const float sum_gw = m.sum(gw.data(), d);
      const float m1 = sum_gw / n;
      // mean(g w x̂) = rstd (Σ g w x - mean Σ g w) / d
      const float m2 = s.rstd * (m.dot(gw.data(), xr, d) - s.mean * sum_gw) / n;
      for (std::int64_t j = 0; j < d; ++j)
        out[j] = s.rstd * (gw[static_cast<std::size_t>(j)] - m1 - (xr[j] - s.mean) * s.rstd * m2);
    }
  });
}

void layer_norm_grad_w_rows(const float* g, const float* x, float* gw, std::int64_t rows,
                            std::int64_t d, float eps) {
  // Each part sums its rows into its own row of `partial`; the parts are added in order.
  const VectorMath& m = vector_math();
  const int parts = parallel_parts(rows, row_grain(d));
  std::vector<float> partial(static_cast<std::size_t>(parts * d), 0.0f);
  parallel_parts_for(rows, parts, [&](int part, std::int64_t first, std::int64_t last) {
    float* sum = partial.data() + part * d;
    for (std::int64_t r = first; r < last; ++r) {
      const float* xr = x + r * d;
      const float* gr = g + r * d;
      const RowStats s = row_stats(m, xr, d, eps);
      for (std::int64_t j = 0; j < d; ++j) sum[j] += gr[j] * (xr[j] - s.mean) * s.rstd;
    }
  });
  for (std::int64_t j = 0; j < d; ++j) gw[j] = partial[static_cast<std::size_t>(j)];
  for (int part = 1; part < parts; ++part)
    for (std::int64_t j = 0; j < d; ++j) gw[j] += partial[static_cast<std::size_t>(part * d + j)];
}

}  // namespace meshflow
