// The scalar loops and the choice of instruction set.
#include "meshflow/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshflow/kernels/norm_rows.h"

#if MESHFLOW_X86_SIMD
#include "meshflow/kernels/vector_math_simd.h"
#endif

namespace meshflow {

namespace {

float gelu_scalar(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

std::array<float, 2> scalar_shifted_sums(const float* x, float c, std::int64_t n) {
  std::array<float, 2> out{};
  for (std::int64_t i = 0; i < n; ++i) {
    out[0] += x[i] - c;
    out[1] += (x[i] - c) * (x[i] - c);
  }
  return out;
}

// The scalar loops norm_rows_with reads.
struct ScalarLoops {
  static float sum(const float* x, std::int64_t n) {
    float s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
  static std::array<float, 2> shifted_sums(const float* x, float c, std::int64_t n) {
    return scalar_shifted_sums(x, c, n);
  }
  static std::array<float, 2> norm_affine(const float* x, NormRow r, const float* w, const float* b,
                                          float* y, const float* next, float next_c,
                                          std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = ((x[i] - r.shift) * r.scale + r.bias) * w[i] + b[i];
    return next ? scalar_shifted_sums(next, next_c, n) : std::array<float, 2>{};
  }
};

const VectorMath kScalar{
    .isa = "scalar",
    .exp = [](const float* x, float* y,
              std::int64_t n) { std::transform(x, x + n, y, [](float v) { return std::exp(v); }); },
    .tanh =
        [](const float* x, float* y, std::int64_t n) {
          std::transform(x, x + n, y, [](float v) { return std::tanh(v); });
        },
    .sigmoid =
        [](const float* x, float* y, std::int64_t n) {
          std::transform(x, x + n, y, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
        },
    .gelu = [](const float* x, float* y,
               std::int64_t n) { std::transform(x, x + n, y, gelu_scalar); },
    .gelu_grad =
        [](const float* g, const float* x, float* y, std::int64_t n) {
          for (std::int64_t i = 0; i < n; ++i) {
            const float cdf = 0.5f * (1.0f + std::erf(x[i] * 0.70710678118654752f));
            const float pdf = std::exp(-0.5f * x[i] * x[i]) * 0.39894228040143268f;
            y[i] = g[i] * (cdf + x[i] * pdf);
          }
        },
    .gelu_tanh =
        [](const float* x, float* y, std::int64_t n) {
          std::transform(x, x + n, y, [](float v) {
            return 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
          });
        },
    .gelu_tanh_grad =
        [](const float* g, const float* x, float* y, std::int64_t n) {
          for (std::int64_t i = 0; i < n; ++i) {
            const float v = x[i];
            const float t = std::tanh(0.7978845608f * (v + 0.044715f * v * v * v));
            const float du = 0.7978845608f * (1.0f + 3 * 0.044715f * v * v);
            y[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
          }
        },
    .max =
        [](const float* x, std::int64_t n) {
          float m = -std::numeric_limits<float>::infinity();
          for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
          return m;
        },
    .sum = ScalarLoops::sum,
    .dot =
        [](const float* a, const float* b, std::int64_t n) {
          float s = 0;
          for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
          return s;
        },
    .shifted_sums = scalar_shifted_sums,
    .norm_grad_dots =
        [](const float* x, const float* g, const float* w, NormRow r, std::int64_t n) {
          std::array<float, 2> out{};
          for (std::int64_t i = 0; i < n; ++i) {
            out[0] += g[i] * w[i];
            out[1] += g[i] * w[i] * ((x[i] - r.shift) * r.scale + r.bias);
          }
          return out;
        },
    .norm_rows = norm_rows_with<ScalarLoops>,
    .norm_grad_w =
        [](const float* x, const float* g, NormRow r, float* sum, float* bias, std::int64_t n) {
          for (std::int64_t i = 0; i < n; ++i) {
            sum[i] += g[i] * ((x[i] - r.shift) * r.scale + r.bias);
            if (bias) bias[i] += g[i];
          }
        },
    .exp_sum =
        [](const float* x, float shift, float* y, std::int64_t n) {
          float sum = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            float e = std::exp(x[i] - shift);
            if (e < std::numeric_limits<float>::min()) e = 0;  // not NaN
            if (y) y[i] = e;
            sum += e;
          }
          return sum;
        },
    .sum_exp =
        [](const float* x, float shift, std::int64_t n) {
          float sum = 0;
          for (std::int64_t i = 0; i < n; ++i)
            sum += std::max(std::exp(x[i] - shift), std::numeric_limits<float>::min());
          return sum;
        },
};

}  // namespace

const VectorMath& scalar_math() { return kScalar; }

std::vector<const VectorMath*> vector_math_all() {
  std::vector<const VectorMath*> all;
#if MESHFLOW_X86_SIMD
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) all.push_back(&vector_math_avx512());
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    all.push_back(&vector_math_avx2());
  all.push_back(&vector_math_sse2());
#endif
  all.push_back(&kScalar);
  return all;
}

const VectorMath& vector_math() {
  static const VectorMath* const chosen = vector_math_all().front();
  return *chosen;
}

}  // namespace meshflow
