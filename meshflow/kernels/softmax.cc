// The row loops: the vector reductions of vector_math, the elementwise passes built per vector
// unit (kernels/vectorize.h).
#include "meshflow/kernels/softmax.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

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

// Floats per chunk of a row: 16 KiB, with dx's chunk 32 KiB, within a 48 KiB first-level cache.
constexpr std::int64_t kChunk = VectorMath::kStreamFloats;  // streamed: the next one prefetched

float log_sum_exp_row(const float* x, std::int64_t n) {
  const VectorMath& m = vector_math();
  float max = -std::numeric_limits<float>::infinity(), sum = 0;
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t len = std::min(kChunk, n - c);
    const float chunk_max = m.max(x + c, len);
    if (chunk_max > max) {
      sum *= std::exp(max - chunk_max);  // 0 while max is -inf
      max = chunk_max;
    }
    sum += m.sum_exp(x + c, max, len);  // prefetching the next chunk meanwhile
  }
  return std::log(sum) + max;
}

void cross_entropy_grad_row(const float* x, std::int64_t n, std::int64_t label, float g,
                            float* dx) {
  const VectorMath& m = vector_math();
  constexpr std::size_t kMaxChunks = 64;  // rows up to 256 Ki classes chunk by chunk
  if (n > kChunk * static_cast<std::int64_t>(kMaxChunks)) {
    scale_into(dx, dx, n, g / m.exp_sum(x, m.max(x, n), dx, n));
    dx[label] -= g;
    return;
  }
  std::array<float, kMaxChunks> shift{};  // the max each chunk's exponentials were taken from
  float max = -std::numeric_limits<float>::infinity(), sum = 0;
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t len = std::min(kChunk, n - c);
    const float chunk_max = m.max(x + c, len);
    if (chunk_max > max) {
      sum *= std::exp(max - chunk_max);
      max = chunk_max;
    }
    shift[static_cast<std::size_t>(c / kChunk)] = max;
    sum += m.exp_sum(x + c, max, dx + c, len);
  }
  const float scale = g / sum;
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const float s = shift[static_cast<std::size_t>(c / kChunk)];
    scale_into(dx + c, dx + c, std::min(kChunk, n - c),
               s == max ? scale : scale * std::exp(s - max));
  }
  dx[label] -= g;
}

void scaled_exp_row(const float* x, std::int64_t n, float shift, float scale, float* dx) {
  const VectorMath& m = vector_math();
  for (std::int64_t c = 0; c < n; c += kChunk) {
    const std::int64_t len = std::min(kChunk, n - c);
    m.exp_sum(x + c, shift, dx + c, len);
    scale_into(dx + c, dx + c, len, scale);
  }
}

}  // namespace meshflow
