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

// A long row (a token's logits) is read from memory once: chunk by chunk, each chunk's max and
// then its exponentials against the running max while the chunk is in the first-level cache,
// the sum so far rescaled by exp(old max - new max) where a chunk raises the max.

// Returns log Σ exp(x[0, n)), n >= 1 (NaN if any x is NaN), the sum by VectorMath::sum_exp:
// each chunk's exponentials computed while the next chunk streams in.
float log_sum_exp_row(const float* x, std::int64_t n);

// dx = g (softmax(x) - onehot(label)): the gradient of g times x's cross-entropy against label.
// The exponentials are written to dx in the same pass, then scaled (each chunk by its own
// factor) while the row is in cache.
void cross_entropy_grad_row(const float* x, std::int64_t n, std::int64_t label, float g, float* dx);

// dx[j] = scale exp(x[j] - shift): a class shard's row of the cross-entropy gradient, given
// the whole row's max (shift) and g / Σ exp(x - shift) over every shard (scale); the caller
// subtracts g at the label (ops/vocab_parallel.h). Chunk by chunk, the exponentials are written
// to dx, then scaled while the chunk is in cache.
void scaled_exp_row(const float* x, std::int64_t n, float shift, float scale, float* dx);

}  // namespace meshflow
