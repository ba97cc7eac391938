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
  static Reg exp(Reg a) { return Sleef_expf4_u10sse2(a); }
  static Reg abs(Reg a) { return _mm_andnot_ps(_mm_set1_ps(-0.0f), a); }
  // Returns magnitude m (>= 0) with the sign of s.
  static Reg with_sign(Reg m, Reg s) { return _mm_or_ps(m, _mm_and_ps(s, _mm_set1_ps(-0.0f))); }
  // Lanes below the smallest normal float become 0 (NaN stays).
  static Reg flush_tiny(Reg a) {
    return _mm_andnot_ps(_mm_cmplt_ps(a, _mm_set1_ps(kSmallestNormal)), a);
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
