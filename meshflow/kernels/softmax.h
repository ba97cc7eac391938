// Softmax's float32 row loops: the masked, scaled softmax of a row (attention's block of scores,
// the softmax operator's rows), its gradient, and softmax cross-entropy's gradient. Vectorised
// (kernels/vector_math.h, kernels/vectorize.h) and in cache: a row is one query's scores
// against every key, or one token's logits.
#pragma once

#include <cstdint>

namespace meshflow {

// y[j] = softmax(scale * x[0, last))[j] for j < last, 0 for last <= j < n (keys a causal
// query does not see). A row with last = 0 is all zeros. y may be x (in place).
void softmax_row(const float* x, float* y, std::int64_t last, std::int64_t n, float scale);

// dp = p ⊙ (dp - Σ p dp) · scale: the gradient of the scores from that of the probabilities.
void softmax_grad_row(const float* p, float* dp, std::int64_t n, float scale);

// dx = g (softmax(x) - onehot(label)): the gradient of g times x's cross-entropy against label,
// from the logits in two passes (the max, then the exponentials and their sum written to dx,
// scaled in cache).
void cross_entropy_grad_row(const float* x, std::int64_t n, std::int64_t label, float g, float* dx);

}  // namespace meshflow
