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
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
  static Reg min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  static Reg round(Reg a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // Returns p 2^n for integral n in [-150, 128]: two factors 2^(n/2) whose exponents are
  // always normal, so the product overflows to inf and underflows to 0 as p 2^n would.
  static Reg scale2(Reg p, Reg n) {
    const __m256i k = _mm256_cvtps_epi32(n), k1 = _mm256_srai_epi32(k, 1),
                  k2 = _mm256_sub_epi32(k, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    return _mm256_mul_ps(
        _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23))),
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23)));
  }
  // Lanes below t become 0 (NaN stays).
  static Reg flush_below(Reg a, float t) {
    return _mm256_andnot_ps(_mm256_cmp_ps(a, _mm256_set1_ps(t), _CMP_LT_OQ), a);
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
