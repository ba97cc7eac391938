// Small models built with the C++ API, shared by graph/'s and runtime/'s tests: DESIGN.md's
// DP×TP MLP and a two-stage pipeline, with seeded initialisers (and labels from `labels`, a
// .npy path that passes never read).
#pragma once

#include <filesystem>

#include "meshflow/graph/pcg.h"

namespace meshflow::testing {

// x[batch, in] S(0),R on a 2x2 mesh; w1 R,S(1); w2 R,S(0); b2 R,R; h = linear(x, w1);
// a = relu(h); o = linear(a, w2, b2); r = reduction(o) -> S(0),R; loss = cross-entropy.
Pcg dp_tp_mlp(const std::filesystem::path& labels, std::int64_t batch = 8, std::int64_t in = 6,
              std::int64_t hidden = 8, std::int64_t classes = 4);

// Stage 0 (devices 0, 1): h = tanh(linear(x, w1)); stage 1 (devices 2, 3): o = linear(h, w2),
// loss = mse(o, t). Both stages shard the batch.
Pcg pipeline(std::int64_t batch = 6, std::int64_t in = 5, std::int64_t out = 3);

// Megatron's sequence-parallel MLP on a dp x tp mesh (a 1-D mesh of tp devices when dp is 1):
// x[batch, in] and target t[batch, out] row-sharded over both dims; e = matmul(x, w0) pinned
// row-sharded, h = linear(tanh(e), w1 (column-parallel), b1) pinned S(1) on tp, so tanh(e) is
// all-gathered over tp into it; o = matmul(gelu(h), w2 (row-parallel)) pinned row-sharded, so
// its Partial result is reduce-scattered over tp; loss = mse(o, t). --overlap decomposes both
// collectives and, in training, the gather of o's gradient into its product.
Pcg sp_mlp(int dp, int tp, std::int64_t batch = 9, std::int64_t in = 5, std::int64_t hidden = 7,
           std::int64_t out = 3);

// `stages` stages of `tp` devices each (stage s on devices s*tp ..): stage s computes
// h_s = tanh(linear(h_{s-1}, w_s)) with w_s[width, width] column-parallel (S(1) over the
// stage's devices; uneven when tp does not divide width), h_0 = x[batch, width] replicated;
// the last stage's o = linear(h, w_out[width, 3]) (replicated) and loss = mse(o, t).
Pcg stage_mlp(int stages, int tp, std::int64_t batch = 8, std::int64_t width = 5);

}  // namespace meshflow::testing
