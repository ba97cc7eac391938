// The fused update loops against the rules written out element by element in double, on
// random shards of float32 and float64, with and without clipping's scale.
#include "meshflow/kernels/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>

#include "meshflow/core/error.h"

namespace meshflow {
namespace {

Tensor random_tensor(DType dtype, std::int64_t n, std::mt19937& rng, double lo, double hi) {
  Tensor t(dtype, Shape{n});
  std::uniform_real_distribution<double> u(lo, hi);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>)
      for (T& x : t.data<T>()) x = static_cast<T>(u(rng));
  });
  return t;
}

double at(const Tensor& t, std::size_t i) {
  double v = 0;
  visit_dtype(t.dtype(), [&](auto zero) { v = static_cast<double>(t.data<decltype(zero)>()[i]); });
  return v;
}

struct Case {
  UpdateRule rule;
  DType dtype;
  double scale;
};

TEST(UpdateShard, MatchesTheRuleWrittenOutInDouble) {
  const std::vector<Case> cases = {
      {{.kind = OptimizerKind::kSgd}, DType::kFloat32, 1},
      {{.kind = OptimizerKind::kSgd, .momentum = 0.9}, DType::kFloat32, 0.37},
      {{.kind = OptimizerKind::kSgd, .momentum = 0.5}, DType::kFloat64, 1},
      {{.kind = OptimizerKind::kAdamW}, DType::kFloat32, 1},
      {{.kind = OptimizerKind::kAdamW,
        .beta1 = 0.8,
        .beta2 = 0.95,
        .eps = 1e-6,
        .weight_decay = 0.1},
       DType::kFloat64,
       0.25},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    const unsigned seed = 17 + static_cast<unsigned>(c);
    std::mt19937 rng(seed);
    constexpr std::int64_t kN = 1037;  // not a multiple of any vector width
    Tensor w = random_tensor(k.dtype, kN, rng, -1, 1);
    const std::size_t states = state_names(k.rule).size();
    std::vector<Tensor> state;
    for (std::size_t s = 0; s < states; ++s) state.emplace_back(k.dtype, Shape{kN});
    std::vector<double> ref_w(kN), ref_m(kN, 0), ref_v(kN, 0);
    for (std::size_t i = 0; i < ref_w.size(); ++i) ref_w[i] = at(w, i);
    for (int step = 1; step <= 3; ++step) {
      const Tensor g = random_tensor(k.dtype, kN, rng, -2, 2);
      const StepScalars s{.lr = 0.01 * step, .step = step, .grad_scale = k.scale};
      std::vector<Tensor*> ptrs;
      for (Tensor& t : state) ptrs.push_back(&t);
      update_shard(k.rule, s, w, g, ptrs);
      const UpdateRule& r = k.rule;
      for (std::size_t i = 0; i < ref_w.size(); ++i) {
        const double gi = at(g, i) * k.scale;
        if (r.kind == OptimizerKind::kSgd) {
          if (r.momentum > 0) {
            ref_m[i] = step == 1 ? gi : r.momentum * ref_m[i] + gi;
            ref_w[i] -= s.lr * ref_m[i];
          } else {
            ref_w[i] -= s.lr * gi;
          }
        } else {
          ref_w[i] *= 1 - s.lr * r.weight_decay;
          ref_m[i] = r.beta1 * ref_m[i] + (1 - r.beta1) * gi;
          ref_v[i] = r.beta2 * ref_v[i] + (1 - r.beta2) * gi * gi;
          const double bc1 = 1 - std::pow(r.beta1, step), bc2 = 1 - std::pow(r.beta2, step);
          ref_w[i] -= s.lr / bc1 * ref_m[i] / (std::sqrt(ref_v[i]) / std::sqrt(bc2) + r.eps);
        }
      }
    }
    const double tol = k.dtype == DType::kFloat32 ? 1e-6 : 1e-14;
    for (std::size_t i = 0; i < ref_w.size(); ++i) {
      ASSERT_NEAR(at(w, i), ref_w[i], tol) << "case " << c << " seed " << seed << " element " << i;
      if (states > 0) {
        ASSERT_NEAR(at(state[0], i), ref_m[i], tol * 10) << "case " << c;
      }
      if (states > 1) {
        ASSERT_NEAR(at(state[1], i), ref_v[i], tol * 10) << "case " << c;
      }
    }
  }
}

TEST(UpdateShard, StateNamesAreTorchOptimsKeys) {
  EXPECT_EQ(state_names({.kind = OptimizerKind::kSgd}), std::vector<std::string>{});
  EXPECT_EQ(state_names({.kind = OptimizerKind::kSgd, .momentum = 0.9}),
            std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(state_names({.kind = OptimizerKind::kAdamW}),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

TEST(SumOfSquares, AccumulatesInDoubleAndSeesNonFiniteElements) {
  std::mt19937 rng(5);
  const Tensor t = random_tensor(DType::kFloat32, 4099, rng, -3, 3);
  double want = 0;
  for (std::size_t i = 0; i < 4099; ++i) want += at(t, i) * at(t, i);
  EXPECT_NEAR(sum_of_squares(t), want, 1e-9 * want);
  Tensor bad = t.clone();
  bad.data<float>()[4098] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_of_squares(bad)));
  bad.data<float>()[4098] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sum_of_squares(bad)));
  // Ranges: three parts sum to the whole, and the bad element is seen only by its part's.
  double parts = 0;
  for (auto [begin, end] :
       {std::pair<std::int64_t, std::int64_t>{0, 1000}, {1000, 1000}, {1000, 4099}}) {
    double part = 0;
    for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
      part += at(t, i) * at(t, i);
    EXPECT_NEAR(sum_of_squares(t, begin, end), part, 1e-9 * want);
    parts += sum_of_squares(t, begin, end);
  }
  EXPECT_NEAR(parts, want, 1e-9 * want);
  EXPECT_TRUE(std::isfinite(sum_of_squares(bad, 0, 4098)));
  EXPECT_TRUE(std::isinf(sum_of_squares(bad, 4098, 4099)));
  EXPECT_THROW(sum_of_squares(t, 5, 4100), Error);
}

TEST(ClipCoefficient, IsTorchsClampedRatio) {
  const UpdateRule none{};
  EXPECT_EQ(clip_coefficient(none, 1e6), 1.0);
  const UpdateRule clip{.clip_grad_norm = 2.0};
  EXPECT_DOUBLE_EQ(clip_coefficient(clip, 16.0), 2.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(clip, 1.0), 1.0);  // a norm under the bound is left alone
}

}  // namespace
}  // namespace meshflow
