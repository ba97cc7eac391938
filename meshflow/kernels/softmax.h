// Softmax's float32 row loops as attention runs them on each block of scores: the masked, scaled
// softmax of a row in place, and its gradient. Vectorised (kernels/vector_math.h) and in cache:
// a row is one query's scores against every key.
#pragma once

#include <cstdint>

namespace meshflow {

// row[j] = softmax(scale * row[0, last))[j] for j < last, 0 for last <= j < n (keys a causal
// query does not see). A row with last = 0 is all zeros.
void softmax_row(float* row, std::int64_t last, std::int64_t n, float scale);

// dp = p ⊙ (dp - Σ p dp) · scale: the gradient of the scores from that of the probabilities.
void softmax_grad_row(const float* p, float* dp, std::int64_t n, float scale);

}  // namespace meshflow
