// The vector loops of kernels/vector_math.h written once over a register type: each
// instruction set's file (vector_math_<isa>.cc, built with that set's compiler flags) supplies
// V, a register of kWidth floats with its loads, arithmetic, 2^n scaling and SLEEF's tanh, and
// instantiates SimdLoops<V>. A loop runs whole registers, then the tail through one padded
// register.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "meshflow/kernels/norm_rows.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow {

// exp_sum's terms below this are 0 (see VectorMath::exp_sum).
constexpr float kSmallestNormal = std::numeric_limits<float>::min();

// The loops of each instruction set this build has (x86-64 only).
const VectorMath& vector_math_avx512();
const VectorMath& vector_math_avx2();
const VectorMath& vector_math_sse2();

template <class V>
struct SimdLoops {
  using R = typename V::Reg;
  static constexpr int kWidth = V::kWidth;

  // y[i] = f(x[i]); the tail's padding lanes hold 0.
  template <class F>
  static void map(const float* x, float* y, std::int64_t n, F f) {
    std::int64_t i = 0;
    for (; i + kWidth <= n; i += kWidth) V::store(y + i, f(V::load(x + i)));
    if (i == n) return;
    alignas(64) float buf[kWidth] = {};
    std::copy(x + i, x + n, buf);
    V::store(buf, f(V::load(buf)));
    std::copy(buf, buf + (n - i), y + i);
  }

  // Returns c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1] by Horner's rule (N-1 multiply-adds,
  // unrolled: N is a constant).
  template <std::size_t N>
  static R polynomial(R x, const float (&c)[N]) {
    R p = V::set1(c[0]);
    for (std::size_t k = 1; k < N; ++k) p = V::fmadd(p, x, V::set1(c[k]));
    return p;
  }

  // Returns exp(x), inline: x = n ln2 + r with |r| <= ln2/2 (Cody and Waite's two-part ln2),
  // exp(r) by a degree-6 polynomial (fitted here for relative error below 2e-9 on that range,
  // Lawson's iteration; 6 multiply-adds), times 2^n by V::scale2 (overflow to inf, underflow to
  // 0 or a denormal). Within 2 float ULP of exp. SLEEF's 1-ULP expf is a call into libsleef
  // that no loop can inline or interleave: the softmax rows ran 1.5-2x slower with it.
  // kNonPositive: the caller knows x <= 0 or NaN (a shifted softmax term, -x²), and the upper
  // clamp is left out. NaN stays NaN: max and min return their second operand where either is.
  template <bool kNonPositive = false>
  static R exp(R x) {
    x = V::max(V::set1(-104.0f), x);
    if constexpr (!kNonPositive) x = V::min(V::set1(89.0f), x);
    const R n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    R r = V::fmadd(n, V::set1(-0.693359375f), x);
    r = V::fmadd(n, V::set1(2.12194440e-4f), r);
    const R p = polynomial(
        r, {0.00138368399f, 0.00837481581f, 0.0416682251f, 0.166664198f, 0.499999911f, 1.0f, 1.0f});
    return V::scale2(p, n);
  }

  // Returns 1/2 + c P(c²) / Q(c²) for Q >= 1 (P and Q's coefficients highest power first). A
  // division, not the hardware's reciprocal estimate and a Newton step: in one bench process
  // (`meshflow bench kernels`, AVX-512), GELU over [2048, 2048] on two threads took 268-273 us
  // with it against 295-300, the loop bound by its multiply-adds, which the division spares.
  template <std::size_t M, std::size_t K>
  static R half_plus_odd_rational(R c, const float (&p)[M], const float (&q)[K]) {
    const R s = V::mul(c, c);
    return V::add(V::div(V::mul(c, polynomial(s, p)), polynomial(s, q)), V::set1(0.5f));
  }

  // GELU and its derivative without an exp, each a rational function of x clamped to where it is
  // within float's resolution of its limit, fitted by fit_gelu.py beside this file (Lawson's
  // iteration on float64 samples; it prints these coefficients). 17 and 19 vector operations,
  // one a division (the derivative's erf formula with its exp took 33): both loops are bound by
  // them, not by memory, on two cores.
  //   Φ(x) = 1/2 + x P(x²) / Q(x²), degrees (5, 5) in x², absolute error below 1e-8 on
  //   [-5.5, 5.5] (beyond it Φ is within 2e-8 of 0 or 1): 2 float ULP of x Φ(x).
  //   Φ(x) + x φ(x) = 1/2 + x P(x²) / Q(x²), degrees (6, 7) in x², absolute error below 3e-8 on
  //   [-6.5, 6.5] (beyond it within 2e-9 of 0 or 1; the A&S 26.2.17 formula it replaces, with
  //   PyTorch's erf, was within 7.5e-8), 3e-7 after float rounding.
  static R gelu_of(R x) {
    const R c = V::min(V::set1(5.5f), V::max(V::set1(-5.5f), x));
    return V::mul(x, half_plus_odd_rational(
                         c,
                         {2.272233956546188e-08f, 6.358342034218367e-06f, 0.0001693554368102923f,
                          0.00468036811798811f, 0.03390112891793251f, 0.398942232131958f},
                         {1.1972132369919564e-06f, 7.38336457288824e-05f, 0.001887357560917735f,
                          0.02867400087416172f, 0.2516433894634247f, 1.0f}));
  }
  static R gelu_slope(R x) {
    const R c = V::min(V::set1(6.5f), V::max(V::set1(-6.5f), x));
    return half_plus_odd_rational(
        c,
        {1.962541951172625e-08f, 1.2589947573360405e-06f, 3.4279019018867984e-05f,
         0.0003289401647634804f, 0.013590877875685692f, -0.015364952385425568f,
         0.7978845238685608f},
        {1.395839888118644e-09f, 4.3145922745679854e-07f, 1.2007351870124694e-05f,
         0.000277332408586517f, 0.004334780387580395f, 0.04672722890973091f, 0.3140757083892822f,
         1.0f});
  }

  static void exp_loop(const float* x, float* y, std::int64_t n) {
    map(x, y, n, [](R v) { return exp(v); });
  }
  static void tanh(const float* x, float* y, std::int64_t n) { map(x, y, n, V::tanh); }
  static R sigmoid_of(R v) {
    const R one = V::set1(1.0f);
    // exp(-x) stops at exp(-87) (x above 87, where 1 + it is 1): no denormal operand.
    const R neg = V::max(V::set1(-87.0f), V::sub(V::set1(0.0f), v));
    return V::div(one, V::add(one, exp(neg)));
  }
  static void sigmoid(const float* x, float* y, std::int64_t n) { map(x, y, n, sigmoid_of); }
  static void gelu(const float* x, float* y, std::int64_t n) { map(x, y, n, gelu_of); }

  // y[i] = f(g[i], x[i]); the tail's padding lanes hold 0.
  template <class F>
  static void map2(const float* g, const float* x, float* y, std::int64_t n, F f) {
    std::int64_t i = 0;
    for (; i + kWidth <= n; i += kWidth) V::store(y + i, f(V::load(g + i), V::load(x + i)));
    if (i == n) return;
    alignas(64) float bg[kWidth] = {}, bx[kWidth] = {};
    std::copy(g + i, g + n, bg);
    std::copy(x + i, x + n, bx);
    V::store(bx, f(V::load(bg), V::load(bx)));
    std::copy(bx, bx + (n - i), y + i);
  }

  static void gelu_grad(const float* g, const float* x, float* y, std::int64_t n) {
    map2(g, x, y, n, [](R gv, R xv) { return V::mul(gv, gelu_slope(xv)); });
  }

  // The tanh form through σ(2u) (VectorMath::gelu_tanh): the inline exp instead of SLEEF's
  // tanh, and no cancellation where tanh(u) nears ±1. 2u = 2√(2/π) x (1 + 0.044715 x²); with
  // e = exp(-2u) (clamped to ±87: no denormal), σ(2u) = 1 / (1 + e) and 1 − σ(2u) = e σ(2u).
  static constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;
  struct Sigma {
    R s, one_minus_s;
  };
  static Sigma sigma_of_two_u(R x) {
    const R two_u = V::mul(V::mul(x, V::set1(kTwoSqrt2OverPi)),
                           V::fmadd(V::mul(x, x), V::set1(0.044715f), V::set1(1.0f)));
    const R neg = V::min(V::set1(87.0f), V::max(V::set1(-87.0f), V::sub(V::set1(0.0f), two_u)));
    const R e = exp(neg);
    const R s = V::div(V::set1(1.0f), V::add(V::set1(1.0f), e));
    return {s, V::mul(e, s)};
  }
  static void gelu_tanh(const float* x, float* y, std::int64_t n) {
    map(x, y, n, [](R v) { return V::mul(v, sigma_of_two_u(v).s); });
  }
  static void gelu_tanh_grad(const float* g, const float* x, float* y, std::int64_t n) {
    map2(g, x, y, n, [](R gv, R xv) {
      const Sigma sg = sigma_of_two_u(xv);
      // (2u)' = 2√(2/π) (1 + 3 · 0.044715 x²)
      const R du = V::mul(V::set1(kTwoSqrt2OverPi),
                          V::fmadd(V::mul(xv, xv), V::set1(3 * 0.044715f), V::set1(1.0f)));
      const R slope = V::fmadd(V::mul(V::mul(xv, sg.s), sg.one_minus_s), du, sg.s);
      return V::mul(gv, slope);
    });
  }

  static float max(const float* x, std::int64_t n) {
    constexpr float kLow = -std::numeric_limits<float>::infinity();
    // Four running maxima: one would wait on the last max's latency every register.
    R m0 = V::set1(kLow), m1 = m0, m2 = m0, m3 = m0;
    std::int64_t i = 0;
    // max(v, m) keeps m where v is NaN: NaNs are skipped, as std::max skips them.
    for (; i + 4 * kWidth <= n; i += 4 * kWidth) {
      m0 = V::max(V::load(x + i), m0);
      m1 = V::max(V::load(x + i + kWidth), m1);
      m2 = V::max(V::load(x + i + 2 * kWidth), m2);
      m3 = V::max(V::load(x + i + 3 * kWidth), m3);
    }
    for (; i + kWidth <= n; i += kWidth) m0 = V::max(V::load(x + i), m0);
    float out = V::hmax(V::max(V::max(m0, m1), V::max(m2, m3)));
    for (; i < n; ++i) out = std::max(out, x[i]);
    return out;
  }

  // Σ f(a[i], b[i]) in 4 kWidth lanes, the tail added in scalar (f's scalar twin g).
  template <class F, class G>
  static float reduce(const float* a, const float* b, std::int64_t n, F f, G g) {
    // Four running sums, added at the end: one would wait on the last add's latency.
    R acc0 = V::set1(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    std::int64_t i = 0;
    for (; i + 4 * kWidth <= n; i += 4 * kWidth) {
      acc0 = V::add(acc0, f(V::load(a + i), V::load(b + i)));
      acc1 = V::add(acc1, f(V::load(a + i + kWidth), V::load(b + i + kWidth)));
      acc2 = V::add(acc2, f(V::load(a + i + 2 * kWidth), V::load(b + i + 2 * kWidth)));
      acc3 = V::add(acc3, f(V::load(a + i + 3 * kWidth), V::load(b + i + 3 * kWidth)));
    }
    for (; i + kWidth <= n; i += kWidth) acc0 = V::add(acc0, f(V::load(a + i), V::load(b + i)));
    float out = V::hsum(V::add(V::add(acc0, acc1), V::add(acc2, acc3)));
    for (; i < n; ++i) out += g(a[i], b[i]);
    return out;
  }
  static float sum(const float* x, std::int64_t n) {
    return reduce(
        x, x, n, [](R v, R) { return v; }, [](float v, float) { return v; });
  }
  static float dot(const float* a, const float* b, std::int64_t n) {
    return reduce(
        a, b, n, [](R u, R v) { return V::mul(u, v); }, [](float u, float v) { return u * v; });
  }
  // A row's moments about c, {Σ d, Σ d²}, d = x - c, in two sets of running sums (one would wait
  // on the last add's latency): whole vector i goes to set (i / kWidth) % 2 where two whole
  // vectors start there, else to set 0; the sets are added, then the tail in scalar.
  struct Moments {
    R c, s[2], q[2];
    explicit Moments(float shift) : c(V::set1(shift)) { s[0] = s[1] = q[0] = q[1] = V::set1(0.0f); }
    void step(const float* x, std::int64_t i, int set) {
      const R d = V::sub(V::load(x + i), c);
      s[set] = V::add(s[set], d);
      q[set] = V::fmadd(d, d, q[set]);
    }
    std::array<float, 2> finish(const float* x, float shift, std::int64_t i, std::int64_t n) {
      std::array<float, 2> out = {V::hsum(V::add(s[0], s[1])), V::hsum(V::add(q[0], q[1]))};
      for (; i < n; ++i) {
        const float d = x[i] - shift;
        out[0] += d;
        out[1] += d * d;
      }
      return out;
    }
  };

  // Calls body(i, set) for every whole vector of a row of n in Moments' sets; returns the
  // first element past them.
  template <class F>
  static std::int64_t whole_vectors(std::int64_t n, F body) {
    std::int64_t i = 0;
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      body(i, 0);
      body(i + kWidth, 1);
    }
    for (; i + kWidth <= n; i += kWidth) body(i, 0);
    return i;
  }

  // Inlined into norm_rows' row loop: a call per row passes NormRow through the stack and leaves
  // the next row waiting on it.
  [[gnu::always_inline]] static std::array<float, 2> shifted_sums(const float* x, float c,
                                                                  std::int64_t n) {
    Moments m(c);
    const std::int64_t i = whole_vectors(n, [&](std::int64_t at, int set) { m.step(x, at, set); });
    return m.finish(x, c, i, n);
  }

  // Prefetches the line kAheadBytes past x[i] (never faults, so it may pass the row's end).
  static constexpr std::int64_t kAheadBytes = VectorMath::kStreamFloats * sizeof(float);
  static void prefetch_ahead(const float* x, std::int64_t i) {
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(x) +
                                                     (i * sizeof(float) + kAheadBytes)));
  }

  // As prefetch_ahead, and the line twice as far into the second-level cache: for a loop whose
  // arithmetic outlasts its reads, memory then stays busy meanwhile. The bench GPT's loss over
  // [2048, 8192] logits (sum_exp) on two threads took 905-990 us with it against 1081-1168
  // without (alternated as cases in one `meshflow bench kernels` process; a second distance of
  // 1.5x or 4x kAheadBytes measured the same). The loss's gradient (exp_sum, which also writes
  // each term) ran 2-8% slower with it, and prefetches the first-level line alone.
  static void prefetch_further(const float* x, std::int64_t i) {
    prefetch_ahead(x, i);
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(x) +
                                                     (i * sizeof(float) + 2 * kAheadBytes)),
                       0, 2);
  }

  static std::array<float, 2> norm_grad_dots(const float* x, const float* g, const float* w,
                                             NormRow r, std::int64_t n) {
    const R shift = V::set1(r.shift), scale = V::set1(r.scale), bias = V::set1(r.bias);
    // Two sets of running sums: one would wait on the last add's latency.
    R gw0 = V::set1(0.0f), gwx0 = gw0, gw1 = gw0, gwx1 = gw0;
    const auto step = [&](std::int64_t i, R& gw, R& gwx) {
      const R xhat = V::fmadd(V::sub(V::load(x + i), shift), scale, bias);
      const R t = V::mul(V::load(g + i), V::load(w + i));
      gw = V::add(gw, t);
      gwx = V::fmadd(t, xhat, gwx);
    };
    std::int64_t i = 0;
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      step(i, gw0, gwx0);
      step(i + kWidth, gw1, gwx1);
    }
    for (; i + kWidth <= n; i += kWidth) step(i, gw0, gwx0);
    std::array<float, 2> out = {V::hsum(V::add(gw0, gw1)), V::hsum(V::add(gwx0, gwx1))};
    for (; i < n; ++i) {
      const float t = g[i] * w[i];
      out[0] += t;
      out[1] += t * ((x[i] - r.shift) * r.scale + r.bias);
    }
    return out;
  }

  // y = x̂ w + b over a row of n, summing next's moments about next_c alongside (where there is a
  // next row); returns them as shifted_sums gives them, or zeros.
  [[gnu::always_inline]] static std::array<float, 2> norm_affine(const float* x, NormRow r,
                                                                 const float* w, const float* b,
                                                                 float* y, const float* next,
                                                                 float next_c, std::int64_t n) {
    const R shift = V::set1(r.shift), scale = V::set1(r.scale), bias = V::set1(r.bias);
    const auto out = [&](std::int64_t i) {
      const R xhat = V::fmadd(V::sub(V::load(x + i), shift), scale, bias);
      V::store(y + i, V::fmadd(xhat, V::load(w + i), V::load(b + i)));
    };
    Moments m(next_c);
    const std::int64_t i = next ? whole_vectors(n,
                                                [&](std::int64_t at, int set) {
                                                  m.step(next, at, set);
                                                  out(at);
                                                })
                                : whole_vectors(n, [&](std::int64_t at, int) { out(at); });
    for (std::int64_t j = i; j < n; ++j) y[j] = ((x[j] - r.shift) * r.scale + r.bias) * w[j] + b[j];
    return next ? m.finish(next, next_c, i, n) : std::array<float, 2>{};
  }

  static void norm_rows(const float* x, const float* w, const float* b, float* y, float* stats,
                        std::int64_t rows, std::int64_t n, float eps) {
    norm_rows_with<SimdLoops>(x, w, b, y, stats, rows, n, eps);
  }

  static void norm_grad_w(const float* x, const float* g, NormRow r, float* sum, float* bias_sum,
                          std::int64_t n) {
    const R shift = V::set1(r.shift), scale = V::set1(r.scale), bias = V::set1(r.bias);
    std::int64_t i = 0;
    for (; i + kWidth <= n; i += kWidth) {
      const R gi = V::load(g + i);
      const R xhat = V::fmadd(V::sub(V::load(x + i), shift), scale, bias);
      V::store(sum + i, V::fmadd(gi, xhat, V::load(sum + i)));
      if (bias_sum) V::store(bias_sum + i, V::add(V::load(bias_sum + i), gi));
    }
    for (; i < n; ++i) {
      sum[i] += g[i] * ((x[i] - r.shift) * r.scale + r.bias);
      if (bias_sum) bias_sum[i] += g[i];
    }
  }

  static float exp_sum(const float* x, float shift, float* y, std::int64_t n) {
    const R s = V::set1(shift);
    R acc = V::set1(0.0f);
    std::int64_t i = 0;
    const bool stream = n >= VectorMath::kStreamFloats;
    for (; i + kWidth <= n; i += kWidth) {
      if (stream) prefetch_ahead(x, i);
      const R e = V::flush_below(exp<true>(V::sub(V::load(x + i), s)), kSmallestNormal);
      if (y) V::store(y + i, e);
      acc = V::add(acc, e);
    }
    if (i < n) {
      alignas(64) float buf[kWidth];
      std::fill(buf, buf + kWidth, -std::numeric_limits<float>::infinity());  // exp: 0
      std::copy(x + i, x + n, buf);
      const R e = V::flush_below(exp(V::sub(V::load(buf), s)), kSmallestNormal);
      acc = V::add(acc, e);
      if (y) {
        V::store(buf, e);
        std::copy(buf, buf + (n - i), y + i);
      }
    }
    return V::hsum(acc);
  }

  // Returns 2^t for t <= 0 (or NaN): t = n + f with |f| <= 1/2, 2^f by a degree-5 polynomial
  // (fitted here for relative error below 1e-7; 1.9e-7 in float arithmetic), times 2^n. t below
  // -126 counts as -126, the smallest normal float's exponent; NaN stays NaN (max returns its
  // second operand where either is NaN).
  static R exp2_nonpositive(R t) {
    t = V::max(V::set1(-126.0f), t);
    const R n = V::round(t);
    const R f = V::sub(t, n);
    const R p = polynomial(f, {0.001326472731307149f, 0.009671512991189957f, 0.05550733581185341f,
                               0.24022242426872253f, 0.6931470036506653f, 1.0f});
    return V::scale2(p, n);
  }

  static float sum_exp(const float* x, float shift, std::int64_t n) {
    constexpr std::int64_t kBlock = 4 * kWidth;  // floats per step: four running sums
    const R s = V::set1(shift), log2e = V::set1(1.44269504088896341f);
    const auto term = [&](R v) { return exp2_nonpositive(V::mul(V::sub(v, s), log2e)); };
    R acc0 = V::set1(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    std::int64_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
      for (std::int64_t b = 0; b < kBlock; b += 64 / sizeof(float)) prefetch_further(x, i + b);
      acc0 = V::add(acc0, term(V::load(x + i)));
      acc1 = V::add(acc1, term(V::load(x + i + kWidth)));
      acc2 = V::add(acc2, term(V::load(x + i + 2 * kWidth)));
      acc3 = V::add(acc3, term(V::load(x + i + 3 * kWidth)));
    }
    for (; i + kWidth <= n; i += kWidth) acc0 = V::add(acc0, term(V::load(x + i)));
    float out = V::hsum(V::add(V::add(acc0, acc1), V::add(acc2, acc3)));
    if (i < n) {
      alignas(64) float buf[kWidth] = {};
      std::copy(x + i, x + n, buf);
      V::store(buf, term(V::load(buf)));
      for (std::int64_t k = 0; k < n - i; ++k) out += buf[k];
    }
    return out;
  }

  static VectorMath table(std::string_view isa) {
    return {.isa = isa,
            .exp = exp_loop,
            .tanh = tanh,
            .sigmoid = sigmoid,
            .gelu = gelu,
            .gelu_grad = gelu_grad,
            .gelu_tanh = gelu_tanh,
            .gelu_tanh_grad = gelu_tanh_grad,
            .max = max,
            .sum = sum,
            .dot = dot,
            .shifted_sums = shifted_sums,
            .norm_grad_dots = norm_grad_dots,
            .norm_rows = norm_rows,
            .norm_grad_w = norm_grad_w,
            .exp_sum = exp_sum,
            .sum_exp = sum_exp};
  }
};

}  // namespace meshflow
