// The row loops against float64 arithmetic, on rows long enough to take several chunks, with the
// largest logit in the first, a middle or the last chunk (the running max then grows, or not).
#include "meshflow/kernels/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace meshflow {
namespace {

std::vector<float> logits(std::int64_t n, std::int64_t peak, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 4);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = d(rng);
  if (peak >= 0) x[static_cast<std::size_t>(peak)] = 40;  // far above the rest
  return x;
}

TEST(SoftmaxRows, LogSumExpAndCrossEntropyGradientAsFloat64) {
  for (std::int64_t n : {1, 17, 4096, 4097, 10000}) {
    for (std::int64_t peak : {std::int64_t{-1}, std::int64_t{0}, n / 2, n - 1}) {
      const std::vector<float> x = logits(n, peak, static_cast<unsigned>(n + peak));
      double mx = -INFINITY;
      for (float v : x) mx = std::max(mx, double{v});
      double sum = 0;
      for (float v : x) sum += std::exp(v - mx);
      const double lse = std::log(sum) + mx;
      EXPECT_NEAR(log_sum_exp_row(x.data(), n), lse, 2e-6 * std::abs(lse) + 1e-6)
          << "n=" << n << " peak=" << peak;

      const std::int64_t label = n / 3;
      const float g = 0.37f;
      std::vector<float> dx(x.size());
      cross_entropy_grad_row(x.data(), n, label, g, dx.data());
      for (std::int64_t j = 0; j < n; ++j) {
        const double want = g * (std::exp(x[j] - lse) - (j == label ? 1.0 : 0.0));
        ASSERT_NEAR(dx[j], want, 1e-6 * g) << "n=" << n << " peak=" << peak << " j=" << j;
      }
    }
  }
}

TEST(SoftmaxRows, ScaledExponentialsAsFloat64) {
  // A class shard's row: its shift is the whole row's max, which may lie in another shard
  // (above every x here) or in this one.
  for (std::int64_t n : {1, 17, 2048, 4097}) {
    for (std::int64_t peak : {std::int64_t{-1}, n / 2}) {
      const std::vector<float> x = logits(n, peak, static_cast<unsigned>(3 * n + peak));
      const float shift = peak < 0 ? 12.5f : 40.0f, scale = 0.0123f;
      std::vector<float> dx(x.size());
      scaled_exp_row(x.data(), n, shift, scale, dx.data());
      for (std::int64_t j = 0; j < n; ++j) {
        const double want = scale * std::exp(double{x[j]} - shift);
        ASSERT_NEAR(dx[j], want, 2e-6 * want + 1e-30)
            << "n=" << n << " peak=" << peak << " j=" << j;
      }
    }
  }
}

TEST(SoftmaxRows, ARowWithANaNGivesNaN) {
  std::vector<float> x = logits(9000, 5000, 3);
  x[7000] = NAN;
  EXPECT_TRUE(std::isnan(log_sum_exp_row(x.data(), 9000)));
  std::vector<float> dx(x.size());
  cross_entropy_grad_row(x.data(), 9000, 2, 1.0f, dx.data());
  EXPECT_TRUE(std::isnan(dx[0]));
}

}  // namespace
}  // namespace meshflow
