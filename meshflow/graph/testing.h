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

}  // namespace meshflow::testing
