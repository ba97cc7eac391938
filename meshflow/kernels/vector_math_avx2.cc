// The vector loops on AVX2 with FMA (built with -mavx2 -mfma; run only where the CPU has them).
#include <immintrin.h>
#include <sleef.h>

#include "meshflow/kernels/vector_math_simd.h"

namespace meshflow {

namespace {

struct Avx2 {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg r) { _mm256_storeu_ps(p, r); }
  static Reg set1(float v) { return _mm256_set1_ps(v); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg exp(Reg a) { return Sleef_expf8_u10avx2(a); }
  static Reg abs(Reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  // Returns magnitude m (>= 0) with the sign of s.
  static Reg with_sign(Reg m, Reg s) {
    return _mm256_or_ps(m, _mm256_and_ps(s, _mm256_set1_ps(-0.0f)));
  }
  // Lanes below the smallest normal float become 0 (NaN stays).
  static Reg flush_tiny(Reg a) {
    return _mm256_andnot_ps(_mm256_cmp_ps(a, _mm256_set1_ps(kSmallestNormal), _CMP_LT_OQ), a);
  }
  static Reg tanh(Reg a) { return Sleef_tanhf8_u10avx2(a); }
  static float hsum(Reg a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
  static float hmax(Reg a) {
    const __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
};

}  // namespace

const VectorMath& vector_math_avx2() {
  static const VectorMath table = SimdLoops<Avx2>::table("avx2");
  return table;
}

}  // namespace meshflow
