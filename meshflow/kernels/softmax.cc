// The row loops: the vector reductions of vector_math, the elementwise passes vectorised at -O3.
#include "meshflow/kernels/softmax.h"

#include <algorithm>

#include "meshflow/kernels/vector_math.h"

namespace meshflow {

void softmax_row(float* row, std::int64_t last, std::int64_t n, float scale) {
  const VectorMath& m = vector_math();
  for (std::int64_t j = 0; j < last; ++j) row[j] *= scale;
  const float sum = last > 0 ? m.exp_sum(row, m.max(row, last), row, last) : 0.0f;
  const float inv = sum > 0 ? 1 / sum : 0;
  for (std::int64_t j = 0; j < last; ++j) row[j] *= inv;
  std::fill(row + std::max<std::int64_t>(last, 0), row + n, 0.0f);
}

void softmax_grad_row(const float* p, float* dp, std::int64_t n, float scale) {
  const float dot = vector_math().dot(p, dp, n);
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot) * scale;
}

}  // namespace meshflow
