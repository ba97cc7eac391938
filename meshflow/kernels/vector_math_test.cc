// Every instruction set's loops against float64 std:: functions, on random values over the
// ranges the operators see, the special values, and lengths that leave every tail size.
#include "meshflow/kernels/vector_math.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "meshflow/kernels/norm_rows.h"

namespace meshflow {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Returns n random values in [-r, r] followed by the special values.
std::vector<float> values(std::int64_t n, float r, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-r, r);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = u(rng);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -87.0f, -104.0f, 20.0f, -20.0f})
    x.push_back(v);
  return x;
}

// Expects got within 4 float ULP of `scale` (by default of want itself) or 1e-37 (results
// near 0).
void expect_close(float got, double want, const char* what, std::string_view isa, float x,
                  double scale = 0) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << " " << isa << " x=" << x;
    return;
  }
  const double tol =
      4 * std::numeric_limits<float>::epsilon() * std::max(scale, std::abs(want)) + 1e-37;
  EXPECT_NEAR(got, want, tol) << what << " " << isa << " x=" << x;
}

double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// PyTorch's gelu(approximate="tanh") and its derivative.
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad(double x) {
  const double t = std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

TEST(VectorMath, EveryIsaMatchesTheFloat64Functions) {
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {0, 1, 3, 7, 15, 17, 1000}) {
      const std::vector<float> x = values(n, 12, 5 + static_cast<unsigned>(n));
      const std::vector<float> g = values(n, 2, 99);
      const auto len = static_cast<std::int64_t>(x.size());
      std::vector<float> y(x.size());
      m->exp(x.data(), y.data(), len);
      for (std::size_t i = 0; i < x.size(); ++i)
        expect_close(y[i], std::exp(double{x[i]}), "exp", m->isa, x[i]);
      m->tanh(x.data(), y.data(), len);
      for (std::size_t i = 0; i < x.size(); ++i)
        expect_close(y[i], std::tanh(double{x[i]}), "tanh", m->isa, x[i]);
      m->sigmoid(x.data(), y.data(), len);
      for (std::size_t i = 0; i < x.size(); ++i)
        expect_close(y[i], 1 / (1 + std::exp(-double{x[i]})), "sigmoid", m->isa, x[i]);
      // Both forms of GELU and their gradients, each against its float64 formula.
      struct Form {
        const char* name;
        void (*fwd)(const float*, float*, std::int64_t);
        void (*grad)(const float*, const float*, float*, std::int64_t);
        double (*want)(double);
        double (*want_grad)(double);
      };
      for (const Form& f :
           {Form{"gelu", m->gelu, m->gelu_grad, gelu, gelu_grad},
            Form{"gelu_tanh", m->gelu_tanh, m->gelu_tanh_grad, gelu_tanh, gelu_tanh_grad}}) {
        f.fwd(x.data(), y.data(), len);
        // 1 + erf(x/√2) cancels for negative x (PyTorch's formula too): error on x's scale.
        for (std::size_t i = 0; i < x.size(); ++i)
          expect_close(y[i], f.want(x[i]), f.name, m->isa, x[i], std::abs(x[i]));
        f.grad(g.data(), x.data(), y.data(), len);
        for (std::size_t i = 0; i < x.size(); ++i) {
          // Φ(x) + x φ(x) cancels near x = -0.75: absolute error against g's scale.
          EXPECT_NEAR(y[i], g[i] * f.want_grad(x[i]), 1e-6 * (1 + std::abs(g[i])))
              << f.name << "_grad " << m->isa << " x=" << x[i];
        }
      }
    }
  }
}

TEST(VectorMath, MaxAndShiftedExpSumAsSoftmaxUsesThem) {
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {0, 1, 5, 16, 33, 8192}) {
      const std::vector<float> x = values(n, 30, 17 + static_cast<unsigned>(n));
      const auto len = static_cast<std::int64_t>(x.size());
      double mx = -kInf;
      for (float v : x) mx = std::max(mx, double{v});
      EXPECT_EQ(m->max(x.data(), len), mx) << m->isa << " n=" << n;
      double sum = 0;
      for (float v : x) sum += std::exp(double{v} - mx);
      std::vector<float> y(x.size());
      const float got = m->exp_sum(x.data(), static_cast<float>(mx), y.data(), len);
      EXPECT_NEAR(got, sum, 1e-5 * sum) << m->isa << " n=" << n;
      EXPECT_EQ(m->exp_sum(x.data(), static_cast<float>(mx), nullptr, len), got) << m->isa;
      // The shift is a float subtraction: exp of its rounded result.
      for (std::size_t i = 0; i < x.size(); ++i)
        expect_close(y[i], std::exp(double{x[i] - static_cast<float>(mx)}), "exp_sum", m->isa,
                     x[i]);
    }
  }
}

// sum_exp's terms against float64 one by one (each through a one-element sum, the other lanes
// padding), then its sums over rows of logits of every scale: near 0, around 100 (where the
// rounding of (x - shift) log2 e grows), and far below the shift (terms at the 2^-126 floor).
TEST(VectorMath, StreamingExpSumAsFloat64) {
  for (const VectorMath* m : vector_math_all()) {
    for (float d : {0.0f, -1e-6f, -0.3f, -0.5f, -0.7f, -1.0f, -5.5f, -10.0f, -40.0f, -87.0f}) {
      const double want = std::exp(double{d}), got = m->sum_exp(&d, 0, 1);
      // 2e-7 from the polynomial, float's rounding of d log2 e (|d| 1.44 2^-24), in relative
      EXPECT_NEAR(got, want, (3e-7 + std::abs(d) * 1e-7) * want) << m->isa << " d=" << d;
    }
    for (float d : {-90.0f, -200.0f, -kInf})  // below 2^-126: counted as 2^-126
      EXPECT_LE(m->sum_exp(&d, 0, 1), 2.0 * std::numeric_limits<float>::min()) << m->isa;
    for (std::int64_t n : {1, 5, 16, 63, 64, 65, 4096, 8195}) {
      for (float center : {0.0f, 100.0f, -100.0f}) {
        std::vector<float> x = values(n, 12, 29 + static_cast<unsigned>(n));
        for (float& v : x) v += center;
        const auto len = static_cast<std::int64_t>(x.size());
        const float shift = m->max(x.data(), len);
        double sum = 0;
        for (float v : x) sum += std::exp(double{v} - double{shift});
        EXPECT_NEAR(m->sum_exp(x.data(), shift, len), sum, 1e-6 * sum)
            << m->isa << " n=" << n << " center=" << center;
      }
    }
    const std::vector<float> row = {1, std::nanf(""), 2};
    EXPECT_TRUE(std::isnan(m->sum_exp(row.data(), 2, 3))) << m->isa;
  }
}

TEST(VectorMath, LayerNormGradientSumsAsFloat64) {
  const NormRow r{.shift = 0.37f, .scale = 0.8f, .bias = -0.21f};
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {0, 1, 7, 16, 31, 33, 512, 4099}) {
      const std::vector<float> x = values(n, 3, 53 + static_cast<unsigned>(n));
      const std::vector<float> g = values(n, 2, 59 + static_cast<unsigned>(n));
      const std::vector<float> w = values(n, 1.5f, 61 + static_cast<unsigned>(n));
      const auto len = static_cast<std::int64_t>(x.size());
      double gw = 0, abs_gw = 0, gwx = 0, abs_gwx = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double t = double{g[i]} * w[i];
        const double xhat = (double{x[i]} - r.shift) * r.scale + r.bias;
        gw += t, abs_gw += std::abs(t);
        gwx += t * xhat, abs_gwx += std::abs(t) * (std::abs((double{x[i]} - r.shift) * r.scale) +
                                                   std::abs(r.bias));
      }
      const std::array<float, 2> got = m->norm_grad_dots(x.data(), g.data(), w.data(), r, len);
      EXPECT_NEAR(got[0], gw, 1e-6 * abs_gw + 1e-30) << m->isa << " n=" << n;
      EXPECT_NEAR(got[1], gwx, 1e-6 * abs_gwx + 1e-30) << m->isa << " n=" << n;
    }
  }
}

// Layer norm's forward rows: the statistics the same bits with the output or without, each row's
// as norm_row makes them from shifted_sums about the mean of its first 64 values (so the pass
// that makes the output sums the next row's moments bit for bit as shifted_sums does), and y as
// float64 arithmetic from the kept statistics.
TEST(VectorMath, LayerNormRowsKeepTheirStatistics) {
  const float eps = 1e-5f;
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {1, 7, 16, 31, 33, 512, 4099}) {
      const auto seed = 71 + static_cast<unsigned>(n);
      std::vector<float> x;
      for (int row = 0; row < 3; ++row)
        for (float v : values(n, 3, seed + static_cast<unsigned>(row)))
          x.push_back(v + 100.0f * row);
      const std::vector<float> w = values(n, 1.5f, seed + 3), b = values(n, 1, seed + 4);
      const auto len = static_cast<std::int64_t>(w.size()), rows = std::int64_t{3};
      std::vector<float> y(x.size()), stats(static_cast<std::size_t>(rows * kNormStatsFloats));
      std::vector<float> alone(stats.size());
      m->norm_rows(x.data(), w.data(), b.data(), y.data(), stats.data(), rows, len, eps);
      m->norm_rows(x.data(), nullptr, nullptr, nullptr, alone.data(), rows, len, eps);
      EXPECT_EQ(stats, alone) << m->isa << " n=" << n;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = x.data() + r * len;
        const std::int64_t k = std::min(len, kShiftFloats);
        const float c = m->sum(row, k) / static_cast<float>(k);
        const std::array<float, 2> sums = m->shifted_sums(row, c, len);
        const NormRow want = norm_row(c, sums[0], sums[1], len, eps);
        const float* s = stats.data() + r * kNormStatsFloats;
        EXPECT_EQ(s[0], want.shift) << m->isa << " n=" << n << " row " << r;
        EXPECT_EQ(s[1], want.scale) << m->isa << " n=" << n << " row " << r;
        EXPECT_EQ(s[2], want.bias) << m->isa << " n=" << n << " row " << r;
        for (std::int64_t j = 0; j < len; ++j) {
          // Within a few ULP of the largest term it sums: (x - shift) scale, bias, then times w
          // plus b.
          const auto i = static_cast<std::size_t>(r * len + j), jw = static_cast<std::size_t>(j);
          const double centred = (double{x[i]} - s[0]) * s[1], xhat = centred + s[2];
          expect_close(y[i], xhat * w[jw] + b[jw], "norm_rows", m->isa, x[i],
                       (std::abs(centred) + std::abs(s[2])) * std::abs(w[jw]) + std::abs(b[jw]));
        }
      }
    }
  }
}

// Layer norm's scale-gradient pass: the scale's sums as float64 arithmetic on the same row, the
// bias's as plain float adds in order.
TEST(VectorMath, LayerNormScaleGradientSums) {
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {1, 7, 16, 31, 33, 512, 4099}) {
      const auto seed = 71 + static_cast<unsigned>(n);
      const std::vector<float> x = values(n, 3, seed), g = values(n, 2, seed + 2);
      const std::vector<float> start = values(n, 4, seed + 5);
      const std::vector<float> bias_start = values(n, 4, seed + 6);
      const auto len = static_cast<std::int64_t>(x.size());
      const NormRow r{.shift = 0.37f, .scale = 0.8f, .bias = -0.21f};
      std::vector<float> sum = start, bias = bias_start;
      m->norm_grad_w(x.data(), g.data(), r, sum.data(), bias.data(), len);
      for (std::size_t i = 0; i < x.size(); ++i) {
        // Within a few ULP of the largest term it sums: (x - shift) scale, bias, then times g
        // plus the running sum.
        const double centred = (double{x[i]} - r.shift) * r.scale, xhat = centred + r.bias;
        const double x_terms = std::abs(centred) + std::abs(r.bias);
        expect_close(sum[i], start[i] + g[i] * xhat, "norm_grad_w", m->isa, x[i],
                     std::abs(start[i]) + x_terms * std::abs(g[i]));
        EXPECT_EQ(bias[i], bias_start[i] + g[i]) << m->isa << " at " << i;
      }
      // Without a bias, the same scale's sums.
      const std::vector<float> with_bias = sum;
      sum = start;
      m->norm_grad_w(x.data(), g.data(), r, sum.data(), nullptr, len);
      EXPECT_EQ(sum, with_bias) << m->isa << " n=" << n;
    }
  }
}

TEST(VectorMath, SumsDotsAndSquaredDeviationsAsFloat64) {
  for (const VectorMath* m : vector_math_all()) {
    for (std::int64_t n : {0, 1, 7, 16, 31, 512, 4099}) {
      const std::vector<float> a = values(n, 3, 41 + static_cast<unsigned>(n));
      const std::vector<float> b = values(n, 2, 43 + static_cast<unsigned>(n));
      const auto len = static_cast<std::int64_t>(a.size());
      double sum = 0, abs_sum = 0, dot = 0, abs_dot = 0, dev = 0, abs_dev = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        sum += a[i];
        abs_sum += std::abs(a[i]);
        dot += double{a[i]} * b[i];
        abs_dot += std::abs(double{a[i]} * b[i]);
        dev += (a[i] - 0.25) * (a[i] - 0.25);
        abs_dev += std::abs(a[i] - 0.25);
      }
      // float accumulation: error within a few ULP of the sum of magnitudes per term
      const double tol = 8 * std::numeric_limits<float>::epsilon() * static_cast<double>(len);
      EXPECT_NEAR(m->sum(a.data(), len), sum, tol * abs_sum + 1e-30) << m->isa << " n=" << n;
      EXPECT_NEAR(m->dot(a.data(), b.data(), len), dot, tol * abs_dot + 1e-30) << m->isa;
      const std::array<float, 2> moments = m->shifted_sums(a.data(), 0.25f, len);
      EXPECT_NEAR(moments[0], sum - 0.25 * static_cast<double>(len), tol * abs_dev + 1e-30)
          << m->isa;
      EXPECT_NEAR(moments[1], dev, tol * dev + 1e-30) << m->isa;
    }
  }
}

// exp is meshflow's own polynomial (not the C library's): every 997th float32 over the whole
// range where its result is a normal float, within 2 ULP of float64's exp.
TEST(VectorMath, ExpWithinTwoUlpWhereverItsResultIsNormal) {
  std::vector<float> x;
  for (std::uint32_t bits = 0; bits < 0x42b17000u; bits += 997) {  // 88.72 and below
    const float v = std::bit_cast<float>(bits);
    x.push_back(v);
    if (v < 87.33f) x.push_back(-v);
  }
  ASSERT_GT(x.size(), 1000000u);
  for (const VectorMath* m : vector_math_all()) {
    std::vector<float> y(x.size());
    m->exp(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    double worst = 0;
    float worst_x = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(double{x[i]});
      const double ulp = std::nextafter(static_cast<float>(want), kInf) - static_cast<float>(want);
      const double err = std::abs(y[i] - want) / ulp;
      if (err > worst) worst = err, worst_x = x[i];
    }
    EXPECT_LE(worst, 2.0) << m->isa << " at x=" << worst_x;
  }
}

TEST(VectorMath, InfinitiesAndNaNsAsTheScalarFunctions) {
  const std::vector<float> x = {kInf, -kInf, std::nanf("")};
  for (const VectorMath* m : vector_math_all()) {
    std::vector<float> y(3);
    m->exp(x.data(), y.data(), 3);
    EXPECT_EQ(y[0], kInf) << m->isa;
    EXPECT_EQ(y[1], 0.0f) << m->isa;
    EXPECT_TRUE(std::isnan(y[2])) << m->isa;
    m->tanh(x.data(), y.data(), 3);
    EXPECT_EQ(y[0], 1.0f) << m->isa;
    EXPECT_EQ(y[1], -1.0f) << m->isa;
    m->sigmoid(x.data(), y.data(), 3);
    EXPECT_EQ(y[0], 1.0f) << m->isa;
    EXPECT_EQ(y[1], 0.0f) << m->isa;
    // A row holding a NaN: the max skips it, the sum carries it (softmax gives NaN).
    const std::vector<float> row = {1, std::nanf(""), 2};
    EXPECT_EQ(m->max(row.data(), 3), 2.0f) << m->isa;
    EXPECT_TRUE(std::isnan(m->exp_sum(row.data(), 2, nullptr, 3))) << m->isa;
  }
}

TEST(VectorMath, ChoosesTheWidestSetThisCpuRuns) {
  EXPECT_EQ(vector_math().isa, vector_math_all().front()->isa);
  EXPECT_EQ(vector_math_all().back()->isa, "scalar");
}

}  // namespace
}  // namespace meshflow
