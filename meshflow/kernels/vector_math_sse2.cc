// The vector loops on SSE2, which every x86-64 CPU has (a multiply-add is two instructions).
#include <immintrin.h>
#include <sleef.h>

#include "meshflow/kernels/vector_math_simd.h"

namespace meshflow {

namespace {

struct Sse2 {
  using Reg = __m128;
  static constexpr int kWidth = 4;
  static Reg load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, Reg r) { _mm_storeu_ps(p, r); }
  static Reg set1(float v) { return _mm_set1_ps(v); }
  static Reg add(Reg a, Reg b) { return _mm_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm_div_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm_sub_ps(c, _mm_mul_ps(a, b)); }  // c - a b
  static Reg min(Reg a, Reg b) { return _mm_min_ps(a, b); }
  // Rounds to nearest (the default rounding mode) through int32: exp's |a| stays below 2^31.
  static Reg round(Reg a) { return _mm_cvtepi32_ps(_mm_cvtps_epi32(a)); }
  // Returns p 2^n for integral n in [-150, 128]: two factors 2^(n/2) whose exponents are
  // always normal, so the product overflows to inf and underflows to 0 as p 2^n would.
  static Reg scale2(Reg p, Reg n) {
    const __m128i k = _mm_cvtps_epi32(n), k1 = _mm_srai_epi32(k, 1), k2 = _mm_sub_epi32(k, k1);
    const __m128i bias = _mm_set1_epi32(127);
    return _mm_mul_ps(_mm_mul_ps(p, _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(k1, bias), 23))),
                      _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(k2, bias), 23)));
  }
  // Lanes below t become 0 (NaN stays).
  static Reg flush_below(Reg a, float t) {
    return _mm_andnot_ps(_mm_cmplt_ps(a, _mm_set1_ps(t)), a);
  }
  static Reg tanh(Reg a) { return Sleef_tanhf4_u10sse2(a); }
  static float hsum(Reg a) {
    const __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
  static float hmax(Reg a) {
    const __m128 t = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
};

}  // namespace

const VectorMath& vector_math_sse2() {
  static const VectorMath table = SimdLoops<Sse2>::table("sse2");
  return table;
}

}  // namespace meshflow
