#include "meshflow/infer/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 2.0f, 1.25f, 0.0f, 1.9f, -3.0f};

TEST(Sampling, GreedyTakesTheLargestLogitAndTheLowestIdOnATie) {
  const Choice c = choose_token(kLogits, {.temperature = 0}, 0, 0);
  EXPECT_EQ(c.token, 1);  // ids 1 and 3 tie at 2.0
  double sum = 0;
  for (float x : kLogits) sum += std::exp(static_cast<double>(x));
  EXPECT_NEAR(c.logprob, 2.0 - std::log(sum), 1e-12);
}

TEST(Sampling, TopKOneAndTinyTopPEqualGreedy) {
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(choose_token(kLogits, {.temperature = 1, .top_k = 1, .seed = 7}, i, 0).token, 1);
    EXPECT_EQ(choose_token(kLogits, {.temperature = 0.8, .top_p = 1e-6, .seed = 3}, i, 1).token, 1);
  }
}

TEST(Sampling, FollowsTheRuleDrawByDraw) {
  // T = 0.5, top-k 4: ids by (-z, id) are 1, 3, 6, 4; top-p 0.9 keeps the prefix reaching it.
  const SamplingOptions o{.temperature = 0.5, .top_k = 4, .top_p = 0.9, .seed = 11};
  const std::vector<int> order = {1, 3, 6, 4};
  std::vector<double> p;
  double sum = 0;
  for (int id : order)
    sum += p.emplace_back(std::exp((kLogits[static_cast<std::size_t>(id)] - 2.0) / 0.5));
  for (double& x : p) x /= sum;
  std::size_t kept = p.size();
  double c = 0;
  for (std::size_t j = 0; j < p.size(); ++j)
    if ((c += p[j]) >= 0.9) {
      kept = j + 1;
      break;
    }
  double s = 0;
  for (std::size_t j = 0; j < kept; ++j) s += p[j];
  int counts[8] = {};
  for (int i = 0; i < 200; ++i) {
    const double u = sampling_draw(o.seed, i, 2);
    int expected = order[kept - 1];
    double cum = 0;
    for (std::size_t j = 0; j < kept; ++j)
      if ((cum += p[j] / s) > u) {
        expected = order[j];
        break;
      }
    const int got = static_cast<int>(choose_token(kLogits, o, i, 2).token);
    EXPECT_EQ(got, expected) << "draw " << i;
    ++counts[got];
  }
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);  // not greedy: both leaders are drawn
  EXPECT_EQ(counts[7], 0);
}

TEST(Sampling, ASeedRepeatsAndSeedsDiffer) {
  auto run = [&](std::uint64_t seed) {
    std::vector<std::int64_t> t;
    for (int i = 0; i < 50; ++i) t.push_back(choose_token(kLogits, {.seed = seed}, i, 0).token);
    return t;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
  EXPECT_NE(run(1u << 20), run((1ull << 32) + (1u << 20)));  // the seed's high word counts
  // Samples of one batch draw apart.
  EXPECT_NE(sampling_draw(5, 0, 0), sampling_draw(5, 0, 1));
}

TEST(Sampling, OptionsOutOfRangeAreNamed) {
  auto message = [](const SamplingOptions& o) {
    try {
      check_sampling(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.temperature = -0.5}).find("--temperature -0.5"), std::string::npos);
  EXPECT_NE(message({.top_k = 0}).find("--top-k 0"), std::string::npos);
  EXPECT_NE(message({.top_p = 0}).find("--top-p 0"), std::string::npos);
  EXPECT_NE(message({.top_p = 1.5}).find("--top-p 1.5"), std::string::npos);
  EXPECT_EQ(message({.temperature = 0, .top_k = 3, .top_p = 1}), "");
}

}  // namespace
}  // namespace meshflow
