// Choosing each new token from the logits at a sample's last position (DESIGN "Generation",
// sampling): greedy at temperature 0, else temperature, top-k and top-p over the ids sorted by
// (-z, id), and one Philox draw per (new token, sample), so the tokens depend on the logits and
// the options alone, never on the mesh that computed them. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace meshflow {

struct SamplingOptions {
  double temperature = 1;       // T >= 0; 0 is greedy
  std::optional<int> top_k;     // K >= 1
  std::optional<double> top_p;  // P in (0, 1]
  std::uint64_t seed = 0;
};

// Throws Error(kInvalidArgument) naming the option (`--temperature`, `--top-k`, `--top-p`) that
// is out of its range.
void check_sampling(const SamplingOptions& options);

struct Choice {
  std::int64_t token = 0;
  double logprob = 0;  // the model's log-softmax of `token` at T = 1
};

// Returns the token chosen from `logits` (one position's, over the vocabulary) for the i-th new
// token (0-based) of sample r: the largest logit (the lowest id on a tie) at T = 0; otherwise
// z = logits / T, the ids sorted by (-z, id), the first K kept, p = softmax(z) over them, the
// shortest prefix whose p sums to >= P kept and p renormalised over it, and the first token
// whose cumulative p exceeds u = (w0 >> 8) / 2^24, w0 from Philox4x32-10 with key (seed, 0) and
// counter (i, r, 0, 0).
Choice choose_token(std::span<const float> logits, const SamplingOptions& options, std::int64_t i,
                    std::int64_t r);

// Returns u for the i-th new token of sample r (the draw choose_token compares with).
double sampling_draw(std::uint64_t seed, std::int64_t i, std::int64_t r);

}  // namespace meshflow
