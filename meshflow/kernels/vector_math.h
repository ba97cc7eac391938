// Float32 math over arrays, vectorised: the transcendental functions of the elementwise
// operators, softmax and attention, and the reductions of softmax and layer norm, on the widest
// vector unit this CPU has, chosen once at run time: AVX-512F, AVX2 with FMA, SSE2 (every
// x86-64); elsewhere the C library's scalar functions. exp is inline (within 2 ULP of the
// scalar std::exp), tanh SLEEF's 1-ULP vector function (the library PyTorch's CPU kernels use);
// GELU's normal CDF and its derivative's Φ(x) + x φ(x) are rational functions fitted here
// (absolute errors below 1e-8 and 3e-8, no exp; PyTorch's erf formula is within 7.5e-8); sums
// accumulate in float lanes.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace meshflow {

// A layer-norm row's x̂ = (x - shift) scale + bias (kernels/norm_rows.h).
struct NormRow {
  float shift = 0, scale = 0, bias = 0;
};

// The loops of one instruction set. Every function takes n elements; an output may alias its
// input (in place).
struct VectorMath {
  // A row at least this long (16 KiB) comes from memory, not from cache: exp_sum then streams
  // it, prefetching as far ahead of each read (a long row read chunk by chunk, or rows one after
  // another, never wait on memory). sum_exp streams every row.
  static constexpr std::int64_t kStreamFloats = 4096;

  std::string_view isa;  // "avx512", "avx2", "sse2", "scalar"
  void (*exp)(const float* x, float* y, std::int64_t n);
  void (*tanh)(const float* x, float* y, std::int64_t n);
  void (*sigmoid)(const float* x, float* y, std::int64_t n);  // 1 / (1 + exp(-x))
  void (*gelu)(const float* x, float* y, std::int64_t n);     // x Φ(x), Φ the normal CDF (erf)
  // y = g * d/dx gelu(x) = g (Φ(x) + x φ(x)), φ the normal density.
  void (*gelu_grad)(const float* g, const float* x, float* y, std::int64_t n);
  // PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh(u)) = x σ(2u), u = √(2/π) (x + 0.044715
  // x³); and y = g times its derivative, σ(2u) + 2 x σ(2u) (1 − σ(2u)) u'.
  void (*gelu_tanh)(const float* x, float* y, std::int64_t n);
  void (*gelu_tanh_grad)(const float* g, const float* x, float* y, std::int64_t n);
  float (*max)(const float* x, std::int64_t n);  // -inf for n = 0; NaN if any is NaN
  float (*sum)(const float* x, std::int64_t n);  // Σ x
  float (*dot)(const float* a, const float* b, std::int64_t n);  // Σ a b
  // A row's moments about c in one pass: {Σ d, Σ d²}, d = x - c.
  std::array<float, 2> (*shifted_sums)(const float* x, float c, std::int64_t n);
  // Layer norm's input-gradient sums over a row in one pass: {Σ g w, Σ g w x̂}.
  std::array<float, 2> (*norm_grad_dots)(const float* x, const float* g, const float* w, NormRow r,
                                         std::int64_t n);
  // Layer norm's forward rows (kernels/norm_rows.h): each row of [rows, n]'s statistics into
  // stats (unless null) and, unless y is null, y = x̂ w + b, in one pass per row that also sums
  // the next row's moments, so that row's reads overlap this row's arithmetic and writes. The
  // statistics are the same bits with y or without.
  void (*norm_rows)(const float* x, const float* w, const float* b, float* y, float* stats,
                    std::int64_t rows, std::int64_t n, float eps);
  // sum += g x̂ and, unless bias is null, bias += g (each element one add, in order).
  void (*norm_grad_w)(const float* x, const float* g, NormRow r, float* sum, float* bias,
                      std::int64_t n);
  // Returns Σ exp(x - shift), shift at least every x (their max, so no term exceeds 1); writes
  // the terms to y unless y is null; streams a row of kStreamFloats or more. A term below the
  // smallest normal float (x - shift < -87.3) is 0: a denormal softmax probability weighs
  // nothing against the largest term (1), and every product it entered would run 10-100x slower.
  float (*exp_sum)(const float* x, float shift, float* y, std::int64_t n);
  // Returns Σ exp(x - shift) as exp_sum does, for a sum alone, faster: streamed whatever its
  // length, each term 2^((x - shift) log2 e) by a shorter polynomial than exp's (relative error
  // below 2e-7, plus float's rounding of the product: a term 40 below the shift is within 2e-6
  // of itself), a term below 2^-126 counted as 2^-126 (at most n·1.2e-38 against a sum of at
  // least 1, and never a denormal operand).
  float (*sum_exp)(const float* x, float shift, std::int64_t n);
};

// Returns the loops for this CPU (chosen on first use).
const VectorMath& vector_math();

// Returns the loops of every instruction set this build has that this CPU runs, widest first,
// the scalar loops last (tests check each against a float64 reference).
std::vector<const VectorMath*> vector_math_all();

// Returns the scalar loops (the C library's functions), the reference and the fallback.
const VectorMath& scalar_math();

}  // namespace meshflow
