// The row loops: the vector reductions of vector_math, the elementwise passes built per vector
// unit (kernels/vectorize.h).
#include "meshflow/kernels/softmax.h"

#include <algorithm>

#include "meshflow/kernels/vector_math.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

namespace {

MESHFLOW_VECTOR_CLONES
void scale_into(const float* x, float* y, std::int64_t n, float s) {
  for (std::int64_t j = 0; j < n; ++j) y[j] = x[j] * s;
}

}  // namespace

void softmax_row(const float* x, float* y, std::int64_t last, std::int64_t n, float scale) {
  const VectorMath& m = vector_math();
  const std::int64_t seen = std::max<std::int64_t>(last, 0);
  if (scale != 1.0f) {
    scale_into(x, y, seen, scale);
    x = y;
  }
  if (seen > 0) scale_into(y, y, seen, 1 / m.exp_sum(x, m.max(x, seen), y, seen));
  std::fill(y + seen, y + n, 0.0f);
}

MESHFLOW_VECTOR_CLONES
void softmax_grad_row(const float* __restrict p, float* __restrict dp, std::int64_t n,
                      float scale) {
  const float dot = vector_math().dot(p, dp, n);
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
}

void cross_entropy_grad_row(const float* x, std::int64_t n, std::int64_t label, float g,
                            float* dx) {
  const VectorMath& m = vector_math();
  scale_into(dx, dx, n, g / m.exp_sum(x, m.max(x, n), dx, n));
  dx[label] -= g;
}

}  // namespace meshflow
