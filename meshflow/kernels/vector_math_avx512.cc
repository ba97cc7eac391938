// The vector loops on AVX-512F (built with -mavx512f -mfma; run only where the CPU has them).
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and trip -Wmaybe-uninitialized
// where they are inlined (GCC bug 105593): a false positive, silenced for this file alone.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <sleef.h>

#include "meshflow/kernels/vector_math_simd.h"

namespace meshflow {

namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg r) { _mm512_storeu_ps(p, r); }
  static Reg set1(float v) { return _mm512_set1_ps(v); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
  static Reg min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  static Reg round(Reg a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // Returns p 2^n for integral n.
  static Reg scale2(Reg p, Reg n) { return _mm512_scalef_ps(p, n); }
  // Lanes below t become 0 (NaN stays).
  static Reg flush_below(Reg a, float t) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(a, _mm512_set1_ps(t), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), a);
  }
  static Reg tanh(Reg a) { return Sleef_tanhf16_u10avx512f(a); }
  // A tree of adds (halves, then quarters, ...), as AVX2's: a row's sums end in it, and the next
  // row's statistics wait on them. Through memory, lane after lane, it took 16 dependent adds,
  // which left layer norm's forward pass 25% slower alone on [2048, 512].
  static float hsum(Reg a) {
    const __m256 lo = _mm512_castps512_ps256(a);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    const __m256 h = _mm256_add_ps(lo, hi);
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
  static float hmax(Reg a) {
    alignas(64) float lanes[kWidth];
    _mm512_store_ps(lanes, a);
    float m = lanes[0];
    for (float v : lanes) m = m > v ? m : v;
    return m;
  }
};

}  // namespace

const VectorMath& vector_math_avx512() {
  static const VectorMath table = SimdLoops<Avx512>::table("avx512");
  return table;
}

}  // namespace meshflow
