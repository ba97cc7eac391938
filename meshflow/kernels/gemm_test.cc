#include "meshflow/kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "meshflow/kernels/parallel.h"

namespace meshflow {
namespace {

TEST(GemmTest, WiderBlasCoreOnlyWhereTheCpuHasAWiderUnit) {
  EXPECT_EQ(wider_blas_core("Prescott", {.avx512 = true, .avx2_fma = true}), "SkylakeX");
  EXPECT_EQ(wider_blas_core("Prescott", {.avx512 = false, .avx2_fma = true}), "Haswell");
  EXPECT_EQ(wider_blas_core("Sandybridge", {.avx512 = false, .avx2_fma = true}), "Haswell");
  EXPECT_EQ(wider_blas_core("Haswell", {.avx512 = true, .avx2_fma = true}), "SkylakeX");
  EXPECT_EQ(wider_blas_core("SkylakeX", {.avx512 = true, .avx2_fma = true}), std::nullopt);
  EXPECT_EQ(wider_blas_core("Zen", {.avx512 = false, .avx2_fma = true}), std::nullopt);
  EXPECT_EQ(wider_blas_core("Prescott", {}), std::nullopt);  // nothing wider to use
  EXPECT_FALSE(blas_core().empty());
}

// op(a) @ op(b) + beta c in float64, the reference.
std::vector<double> reference(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                              const std::vector<float>& a, const std::vector<float>& b, float beta,
                              const std::vector<float>& c) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = beta * static_cast<double>(c[static_cast<std::size_t>(i * n + j)]);
      for (std::int64_t p = 0; p < k; ++p) {
        const float x = a[static_cast<std::size_t>(ta ? p * m + i : i * k + p)];
        const float y = b[static_cast<std::size_t>(tb ? j * k + p : p * n + j)];
        s += static_cast<double>(x) * y;
      }
      out[static_cast<std::size_t>(i * n + j)] = s;
    }
  }
  return out;
}

TEST(GemmTest, ATeamSplitsRowsOrColumnsAndAgreesWithFloat64) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadTeam team(3);
  // Rows split (m >= n), columns split (n > m), both large enough to split, and one too small.
  const std::int64_t shapes[][3] = {{300, 130, 170}, {90, 410, 150}, {7, 9, 5}};
  for (const auto& s : shapes) {
    const std::int64_t m = s[0], n = s[1], k = s[2];
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
          std::vector<float> c(static_cast<std::size_t>(m * n));
          for (auto* v : {&a, &b, &c})
            for (float& x : *v) x = normal(rng);
          const std::vector<double> want = reference(ta, tb, m, n, k, a, b, beta, c);
          for (bool with_team : {false, true}) {
            const UseTeam use(with_team ? &team : nullptr);
            std::vector<float> got = c;
            gemm<float>(ta, tb, m, n, k, a.data(), ta ? m : k, b.data(), tb ? k : n, beta,
                        got.data(), n);
            for (std::size_t i = 0; i < got.size(); ++i) {
              ASSERT_NEAR(got[i], want[i], 1e-4 * (std::abs(want[i]) + std::sqrt(double(k))))
                  << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb << " beta " << beta
                  << " team " << with_team << " at " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace meshflow
