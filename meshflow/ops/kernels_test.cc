// Kernels against independent references: naive loops written here for every forward operator,
// and central finite differences for every gradient program (float64).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "meshflow/core/box.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/gradient.h"
#include "meshflow/ops/kernels_testing.h"
#include "meshflow/ops/op.h"
#include "tests/error_of.h"

namespace meshflow {
namespace {

using testing::at;
using testing::error_of;
using testing::expect_near;
using testing::ids;
using testing::rnd;
using testing::run;

// A kernel's work is the product of its labels' extents, read from the local shapes: a matrix
// product's multiply-adds, an elementwise operator's elements, a reduction's inputs.
TEST(WorkPoints, ProductOfEveryLabelsLocalExtent) {
  const TensorSpec a{{4, 3}, DType::kFloat32}, b{{3, 5}, DType::kFloat32};
  const Op mm{.type = OpType::kMatmul};
  EXPECT_EQ(work_points(mm, {a, b}, {{4, 3}, {3, 5}}, {4, 5}), 60);
  EXPECT_EQ(work_points(mm, {a, b}, {{2, 3}, {3, 5}}, {2, 5}), 30);  // rows sharded in two
  const TensorSpec row{{5}, DType::kFloat32}, m{{4, 5}, DType::kFloat32};
  EXPECT_EQ(work_points(Op{.type = OpType::kAdd}, {m, row}, {{4, 5}, {5}}, {4, 5}), 20);
  const Op sum0 = normalize(Op{.type = OpType::kSum, .dims = {0}}, {m});
  EXPECT_EQ(work_points(sum0, {m}, {{4, 5}}, {5}), 20);
  const TensorSpec scalar{{}, DType::kFloat32};
  EXPECT_EQ(work_points(Op{.type = OpType::kNeg}, {scalar}, {{}}, {}), 1);
}

// A causal attention's work counts the keys each block of 64 queries sees, from where the
// query shard starts: of 256 positions split in two, the second half sees 3 times the first's.
TEST(WorkPoints, CausalAttentionCountsTheKeysAQueryShardSees) {
  const TensorSpec qkv{{2, 256, 8}, DType::kFloat32};
  const Op op{.type = OpType::kAttention, .causal = true};
  const std::vector<TensorSpec> globals{qkv, qkv, qkv};
  const Shape half{2, 128, 8}, whole{2, 256, 8};
  // pairs x (Dk + Dv) x batch; blocks of 64 rows see 64, 128, ... keys
  const double first = work_points(op, globals, {half, whole, whole}, half, {{0, 0, 0}});
  const double second = work_points(op, globals, {half, whole, whole}, half, {{0, 128, 0}});
  EXPECT_EQ(first, 2.0 * 64 * (64 + 128) * 16);
  EXPECT_EQ(second, 2.0 * 64 * (192 + 256) * 16);
  EXPECT_EQ(work_points(op, globals, {whole, whole, whole}, whole), first + second);
  // Without the mask every query sees every key, wherever its shard starts.
  const Op full{.type = OpType::kAttention};
  EXPECT_EQ(work_points(full, globals, {half, whole, whole}, half, {{0, 128, 0}}),
            2.0 * 128 * 256 * 16);
}

TEST(Kernels, MatmulWithBatchedLeftOperandMatchesNaiveLoops) {
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    const Tensor a = rnd({2, 3, 5}, 1, dt), b = rnd({5, 4}, 2, dt);
    const Tensor c = run({.type = OpType::kMatmul}, {&a, &b});
    ASSERT_EQ(c.shape(), (Shape{2, 3, 4}));
    std::vector<double> want;
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0;
        for (int k = 0; k < 5; ++k) s += at(a, i * 5 + k) * at(b, k * 4 + j);
        want.push_back(s);
      }
    expect_near(c, want, dt == DType::kFloat32 ? 1e-5 : 1e-12, "matmul");
  }
}

TEST(Kernels, LinearAddsTheBiasToEveryRow) {
  const Tensor x = rnd({3, 4}, 3), w = rnd({4, 2}, 4), b = rnd({2}, 5);
  const Tensor y = run({.type = OpType::kLinear}, {&x, &w, &b});
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double s = at(b, j);
      for (int k = 0; k < 4; ++k) s += at(x, i * 4 + k) * at(w, k * 2 + j);
      want.push_back(s);
    }
  expect_near(y, want, 1e-12, "linear");
}

// Accumulating adds the kernel's result to the sum: the matrix products inside their GEMM
// (every family member, float32 and float64, a linear's bias added too), another kernel by
// adding its result; the sum's other values are kept, not overwritten.
TEST(Kernels, AccumulatingAddsTheResultToTheSum) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const double tol = dtype == DType::kFloat32 ? 1e-5 : 1e-12;
    const Tensor a = rnd({2, 5, 4}, 11, dtype), w = rnd({4, 3}, 12, dtype),
                 g = rnd({2, 5, 3}, 13, dtype);
    const Tensor bias = rnd({3}, 14, dtype);
    const std::vector<std::pair<Op, std::vector<const Tensor*>>> cases = {
        {{.type = OpType::kMatmul}, {&a, &w}},
        {{.type = OpType::kLinear}, {&a, &w, &bias}},
        {{.type = OpType::kMatmulGradA}, {&g, &w}},
        {{.type = OpType::kMatmulGradB}, {&a, &g}},
        {{.type = OpType::kTanh}, {&a}},
    };
    for (const auto& [op, in] : cases) {
      std::vector<TensorSpec> specs;
      for (const Tensor* t : in) specs.push_back(spec_of(*t));
      const Tensor made = run_kernel(op, in, specs);
      Tensor sum = rnd(made.shape(), 15, dtype);
      std::vector<double> want;
      for (std::int64_t i = 0; i < made.numel(); ++i) want.push_back(at(sum, i) + at(made, i));
      run_kernel_accumulate(op, in, specs, {}, sum);
      expect_near(sum, want, tol, std::string(to_string(op.type)) + " accumulated");
    }
  }
}

TEST(Kernels, EmptyContractionGivesZerosAndEmptyOperandsGiveEmptyResults) {
  const Tensor a = rnd({3, 0}, 1), b = rnd({0, 2}, 2);
  const Tensor c = run({.type = OpType::kMatmul}, {&a, &b});
  expect_near(c, std::vector<double>(6, 0.0), 0, "k = 0");
  const Tensor e = rnd({0, 4}, 3), f = rnd({4}, 4);
  EXPECT_EQ(run({.type = OpType::kAdd}, {&e, &f}).shape(), (Shape{0, 4}));
}

TEST(Kernels, BinaryOperatorsBroadcastAsNumPy) {
  const std::vector<std::pair<Shape, Shape>> cases = {{{3, 4}, {3, 4}}, {{3, 4}, {4}},
                                                      {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}},
                                                      {{4}, {2, 3, 4}}, {{}, {2, 2}}};
  for (auto [sa, sb] : cases) {
    const Tensor a = rnd(sa, 7), b = rnd(sb, 8);
    for (OpType t : {OpType::kAdd, OpType::kSub, OpType::kMul, OpType::kDiv}) {
      const Tensor c = run({.type = t}, {&a, &b});
      // Naive: index every output element, map it back to each operand.
      const Shape& so = c.shape();
      std::vector<double> want;
      for (std::int64_t i = 0; i < c.numel(); ++i) {
        std::vector<std::int64_t> idx(so.size());
        std::int64_t rem = i;
        for (std::size_t d = so.size(); d-- > 0;) {
          idx[d] = rem % so[d];
          rem /= so[d];
        }
        auto flat = [&](const Shape& s) {
          std::int64_t f = 0;
          for (std::size_t d = 0; d < s.size(); ++d)
            f = f * s[d] + (s[d] == 1 ? 0 : idx[d + so.size() - s.size()]);
          return f;
        };
        const double x = at(a, flat(sa)), y = at(b, flat(sb));
        want.push_back(t == OpType::kAdd   ? x + y
                       : t == OpType::kSub ? x - y
                       : t == OpType::kMul ? x * y
                                           : x / y);
      }
      expect_near(c, want, 1e-12,
                  std::string(to_string(t)) + " " + to_string(sa) + " " + to_string(sb));
    }
  }
}

TEST(Kernels, UnaryOperatorsMatchTheirFormulas) {
  const Tensor x = rnd({17}, 9);
  const std::vector<std::pair<OpType, std::function<double(double)>>> cases = {
      {OpType::kNeg, [](double v) { return -v; }},
      {OpType::kRelu, [](double v) { return v > 0 ? v : 0; }},
      {OpType::kGelu, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {OpType::kTanh, [](double v) { return std::tanh(v); }},
      {OpType::kSigmoid, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {OpType::kExp, [](double v) { return std::exp(v); }}};
  for (const auto& [t, f] : cases) {
    std::vector<double> want;
    for (int i = 0; i < 17; ++i) want.push_back(f(at(x, i)));
    expect_near(run({.type = t}, {&x}), want, 1e-12, std::string(to_string(t)));
  }
}

// PyTorch's gelu(approximate="tanh"), in float64 and float32, and its gradient; the erf form
// differs from it (by up to about 5e-4), so the attribute is what selects it.
TEST(Kernels, GeluTanhFormIsPyTorchsFormula) {
  const Tensor x = rnd({65}, 21);
  auto form = [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
  };
  const Op op{.type = OpType::kGelu, .approximate_tanh = true};
  std::vector<double> want;
  for (int i = 0; i < 65; ++i) want.push_back(form(3 * at(x, i)));
  Tensor x3 = Tensor::uninitialized(DType::kFloat64, {65});
  for (int i = 0; i < 65; ++i) x3.data<double>()[i] = 3 * at(x, i);
  expect_near(run(op, {&x3}), want, 1e-12, "gelu tanh float64");
  Tensor x32 = Tensor::uninitialized(DType::kFloat32, {65});
  for (int i = 0; i < 65; ++i) x32.data<float>()[i] = static_cast<float>(3 * at(x, i));
  const Tensor y32 = run(op, {&x32});
  for (int i = 0; i < 65; ++i)
    EXPECT_NEAR(y32.data<float>()[i], form(x32.data<float>()[i]), 1e-6 * (1 + std::abs(want[i])));
  const Tensor erf = run({.type = OpType::kGelu}, {&x3});
  double most = 0;
  for (int i = 0; i < 65; ++i) most = std::max(most, std::abs(at(erf, i) - want[i]));
  EXPECT_GT(most, 1e-5);
  // The gradient: g times the formula's derivative (a central difference in float64).
  const Tensor g = rnd({65}, 22);
  const Tensor dx = run({.type = OpType::kGeluGrad, .approximate_tanh = true}, {&g, &x3});
  for (int i = 0; i < 65; ++i) {
    const double v = at(x3, i), h = 1e-5;
    EXPECT_NEAR(at(dx, i), at(g, i) * (form(v + h) - form(v - h)) / (2 * h), 1e-8) << i;
  }
}

TEST(Kernels, SumAndMeanOverAnyDims) {
  const Tensor x = rnd({2, 3, 4}, 10);
  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{0}, {1}, {2}, {0, 2}, {-1}, {0, 1, 2}}) {
    for (OpType t : {OpType::kSum, OpType::kMean}) {
      const Tensor y = run({.type = t, .dims = dims}, {&x});
      auto kept = [&](int d) {
        for (int r : dims)
          if ((r + 3) % 3 == d) return false;
        return true;
      };
      Shape s;
      for (int d = 0; d < 3; ++d)
        if (kept(d)) s.push_back(x.shape()[d]);
      std::vector<double> want(static_cast<std::size_t>(numel(s)), 0.0);
      double count = 1;
      for (int d = 0; d < 3; ++d)
        if (!kept(d)) count *= static_cast<double>(x.shape()[d]);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          for (int k = 0; k < 4; ++k) {
            const int idx[3] = {i, j, k};
            std::int64_t o = 0;
            for (int d = 0; d < 3; ++d)
              if (kept(d)) o = o * x.shape()[d] + idx[d];
            want[static_cast<std::size_t>(o)] +=
                at(x, (i * 3 + j) * 4 + k) / (t == OpType::kMean ? count : 1);
          }
      EXPECT_EQ(y.shape(), s);
      expect_near(y, want, 1e-12, to_string(Op{.type = t, .dims = dims}));
    }
  }
}

TEST(Kernels, SoftmaxAndLossesMatchNaiveFormulas) {
  const Tensor x = rnd({3, 5}, 11);
  const Tensor y = run({.type = OpType::kSoftmax, .dim = 0}, {&x});
  for (int j = 0; j < 5; ++j) {
    double z = 0;
    for (int i = 0; i < 3; ++i) z += std::exp(at(x, i * 5 + j));
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(at(y, i * 5 + j), std::exp(at(x, i * 5 + j)) / z, 1e-12);
  }
  Tensor labels(DType::kInt64, {3});
  labels.data<std::int64_t>()[0] = 4;
  labels.data<std::int64_t>()[1] = 0;
  labels.data<std::int64_t>()[2] = 2;
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    double z = 0;
    for (int j = 0; j < 5; ++j) z += std::exp(at(x, i * 5 + j));
    want += -std::log(std::exp(at(x, i * 5 + labels.data<std::int64_t>()[i])) / z) / 3;
  }
  expect_near(run({.type = OpType::kSoftmaxCrossEntropy}, {&x, &labels}), {want}, 1e-12, "sce");
  const Tensor b = rnd({3, 5}, 12);
  double m = 0;
  for (int i = 0; i < 15; ++i) m += (at(x, i) - at(b, i)) * (at(x, i) - at(b, i)) / 15;
  expect_near(run({.type = OpType::kMse}, {&x, &b}), {m}, 1e-12, "mse");
  labels.data<std::int64_t>()[1] = 5;
  try {
    run({.type = OpType::kSoftmaxCrossEntropy}, {&x, &labels});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 5 (row 1 of this shard) is outside [0, 5)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Kernels, LayerNormMatchesItsFormulaWithTheBiasedVariance) {
  const Tensor x = rnd({3, 7}, 1), w = rnd({7}, 2), b = rnd({7}, 3);
  const Tensor y = run({.type = OpType::kLayerNorm, .eps = 0.01}, {&x, &w, &b});
  std::vector<double> want;
  for (int r = 0; r < 3; ++r) {
    double mean = 0, sq = 0;
    for (int j = 0; j < 7; ++j) mean += at(x, r * 7 + j) / 7;
    for (int j = 0; j < 7; ++j) sq += (at(x, r * 7 + j) - mean) * (at(x, r * 7 + j) - mean);
    for (int j = 0; j < 7; ++j)
      want.push_back((at(x, r * 7 + j) - mean) / std::sqrt(sq / 7 + 0.01) * at(w, j) + at(b, j));
  }
  expect_near(y, want, 1e-12, "layer_norm");
  const Tensor xf = rnd({2, 4}, 4, DType::kFloat32), wf = rnd({4}, 5, DType::kFloat32);
  const Tensor bf = rnd({4}, 6, DType::kFloat32);
  EXPECT_EQ(run({.type = OpType::kLayerNorm}, {&xf, &wf, &bf}).dtype(), DType::kFloat32);
}

// softmax(q kᵀ / √Dk, masked above the diagonal when causal) v, one score at a time.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal) {
  const std::int64_t b = q.shape()[0], sq = q.shape()[1], dk = q.shape()[2];
  const std::int64_t sk = k.shape()[1], dv = v.shape()[2];
  std::vector<double> out;
  for (std::int64_t n = 0; n < b; ++n)
    for (std::int64_t i = 0; i < sq; ++i) {
      std::vector<double> s;
      double mx = -1e300, sum = 0;
      for (std::int64_t j = 0; j < sk; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < dk; ++c)
          dot += at(q, (n * sq + i) * dk + c) * at(k, (n * sk + j) * dk + c);
        s.push_back(causal && j > i ? -1e300 : dot / std::sqrt(static_cast<double>(dk)));
        mx = std::max(mx, s.back());
      }
      for (double& x : s) sum += x = x <= -1e300 ? 0 : std::exp(x - mx);
      for (std::int64_t c = 0; c < dv; ++c) {
        double acc = 0;
        for (std::int64_t j = 0; j < sk; ++j)
          acc += s[static_cast<std::size_t>(j)] / sum * at(v, (n * sk + j) * dv + c);
        out.push_back(acc);
      }
    }
  return out;
}

TEST(Kernels, AttentionMatchesNaiveScoresAcrossRowBlocks) {
  // 70 query rows: two blocks of the kernel's row loop
  const Tensor q = rnd({2, 70, 5}, 1), k = rnd({2, 70, 5}, 2), v = rnd({2, 70, 3}, 3);
  for (bool causal : {false, true}) {
    expect_near(run({.type = OpType::kAttention, .causal = causal}, {&q, &k, &v}),
                naive_attention(q, k, v, causal), 1e-12, causal ? "causal" : "full");
  }
  const Tensor q2 = rnd({1, 3, 4}, 4), k2 = rnd({1, 9, 4}, 5), v2 = rnd({1, 9, 2}, 6);
  expect_near(run({.type = OpType::kAttention}, {&q2, &k2, &v2}),
              naive_attention(q2, k2, v2, false), 1e-12, "Sq != Sk");
}

// Returns t converted to float32 (or float64).
Tensor as_dtype(const Tensor& t, DType dtype) {
  Tensor out(dtype, t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (dtype == DType::kFloat32) {
      out.data<float>()[k] = static_cast<float>(at(t, i));
    } else {
      out.data<double>()[k] = at(t, i);
    }
  }
  return out;
}

// The float32 path (vector softmax rows, a causal block's products over the keys it sees)
// against the float64 reference: the forward against the naive scores, each gradient against
// the float64 kernel (which finite differences check), over three row blocks (150 queries), a
// query shard starting at position 80 of the keys (offsets), and Sq != Sk.
TEST(Kernels, AttentionInFloat32MatchesFloat64) {
  const Tensor q = rnd({2, 150, 8}, 31), k = rnd({2, 150, 8}, 32), v = rnd({2, 150, 6}, 33);
  const Tensor g = rnd({2, 150, 6}, 34);
  const Tensor qf = as_dtype(q, DType::kFloat32), kf = as_dtype(k, DType::kFloat32);
  const Tensor vf = as_dtype(v, DType::kFloat32), gf = as_dtype(g, DType::kFloat32);
  for (bool causal : {false, true}) {
    const std::string what = causal ? "causal" : "full";
    expect_near(run({.type = OpType::kAttention, .causal = causal}, {&qf, &kf, &vf}),
                naive_attention(q, k, v, causal), 2e-5, what + " float32");
    for (OpType type :
         {OpType::kAttentionGradQ, OpType::kAttentionGradK, OpType::kAttentionGradV}) {
      const Tensor want = run({.type = type, .causal = causal}, {&q, &k, &v, &g});
      std::vector<double> w;
      for (std::int64_t i = 0; i < want.numel(); ++i) w.push_back(at(want, i));
      expect_near(run({.type = type, .causal = causal}, {&qf, &kf, &vf, &gf}), w, 2e-5,
                  what + " " + std::string(to_string(type)) + " float32");
    }
  }
  // Queries 80..149 against every key: the causal mask by global position.
  const Tensor tail = slice(q, Box{{0, 80, 0}, {2, 70, 8}});
  const Tensor tail_f = as_dtype(tail, DType::kFloat32);
  const Op op{.type = OpType::kAttention, .causal = true};
  const TensorSpec qs{{2, 150, 8}, DType::kFloat32}, ks = spec_of(kf), vs = spec_of(vf);
  const Tensor got =
      run_kernel(op, {&tail_f, &kf, &vf}, {qs, ks, vs}, {{0, 80, 0}, {0, 0, 0}, {0, 0, 0}});
  const std::vector<double> full = naive_attention(q, k, v, true);
  std::vector<double> want;
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t i = 80; i < 150; ++i)
      for (std::int64_t c = 0; c < 6; ++c)
        want.push_back(full[static_cast<std::size_t>((n * 150 + i) * 6 + c)]);
  expect_near(got, want, 2e-5, "causal query shard at offset 80, float32");
}

// Attention's gradients run together (run_kernels: one pass sharing the probabilities and dS)
// give what each gives alone, bit for bit: every subset in both orders, float32 and float64,
// full and causal, on the whole operands and on a query shard starting at key 80; and the
// pass's work is the shared products', less than the three alone.
TEST(Kernels, AttentionGradientsRunTogetherGiveWhatEachGivesAlone) {
  const OpType kQ = OpType::kAttentionGradQ, kK = OpType::kAttentionGradK;
  const OpType kV = OpType::kAttentionGradV;
  const std::vector<std::vector<OpType>> sets = {{kQ, kK, kV}, {kV, kK, kQ}, {kQ, kK},
                                                 {kK, kV},     {kV, kQ},     {kK, kQ}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor q = rnd({2, 150, 8}, 41, dtype), k = rnd({2, 150, 8}, 42, dtype);
    const Tensor v = rnd({2, 150, 6}, 43, dtype), g = rnd({2, 150, 6}, 44, dtype);
    const Tensor tail = slice(q, Box{{0, 80, 0}, {2, 70, 8}});
    const Tensor g_tail = slice(g, Box{{0, 80, 0}, {2, 70, 6}});
    const TensorSpec qs{{2, 150, 8}, dtype}, ks = spec_of(k), vs = spec_of(v);
    const TensorSpec gs{{2, 150, 6}, dtype};
    struct Operands {
      std::vector<const Tensor*> locals;
      ShardOffsets offsets;
      std::string what;
    };
    const std::vector<Operands> operands = {
        {{&q, &k, &v, &g}, {}, "whole"},
        {{&tail, &k, &v, &g_tail}, {{0, 80, 0}, {0, 0, 0}, {0, 0, 0}, {0, 80, 0}}, "shard"}};
    for (bool causal : {false, true})
      for (const Operands& o : operands)
        for (const std::vector<OpType>& set : sets) {
          std::vector<Op> ops;
          for (OpType t : set) ops.push_back(Op{.type = t, .causal = causal});
          const std::vector<Tensor> together =
              run_kernels(ops, o.locals, {qs, ks, vs, gs}, o.offsets);
          ASSERT_EQ(together.size(), ops.size());
          for (std::size_t i = 0; i < ops.size(); ++i) {
            const Tensor alone = run_kernel(ops[i], o.locals, {qs, ks, vs, gs}, o.offsets);
            const std::string what =
                fmt::format("{} {} {} {} of {}", to_string(dtype), causal ? "causal" : "full",
                            o.what, to_string(set[i]), set.size());
            ASSERT_EQ(together[i].shape(), alone.shape()) << what;
            std::vector<double> want;
            for (std::int64_t e = 0; e < alone.numel(); ++e) want.push_back(at(alone, e));
            expect_near(together[i], want, 0, what);
          }
        }
  }
  const std::vector<Shape> local = {{2, 150, 8}, {2, 150, 8}, {2, 150, 8}, {2, 150, 8}};
  std::vector<TensorSpec> globals;
  for (const Shape& s : local) globals.push_back({s, DType::kFloat32});
  double alone = 0;
  std::vector<Op> all;
  for (OpType t : {kQ, kK, kV}) {
    all.push_back(Op{.type = t});
    alone += work_points(all.back(), globals, local, local[0]);
  }
  // Alone: 3 + 3 + 2 products of 150 x 150 by 8 per batch; together: 5.
  EXPECT_DOUBLE_EQ(alone, 2.0 * 150 * 150 * 8 * 8);
  EXPECT_DOUBLE_EQ(work_points(all, globals, local, {local[0], local[0], local[0]}),
                   2.0 * 150 * 150 * 8 * 5);
}

// Layer norm's siblings run together give what each gives alone, bit for bit, in either order:
// the forward pass with its statistics, and the weight gradients (one pass over g and x), in
// float32 and float64, on shapes whose rows sum_rows adds in blocks (the pass shared) and in one
// (each alone), alone and on a team of 3.
TEST(Kernels, LayerNormSiblingsRunTogetherGiveWhatEachGivesAlone) {
  ThreadTeam team(3);
  for (DType dtype : {DType::kFloat32, DType::kFloat64})
    for (const Shape& shape :
         std::vector<Shape>{{2048, 512}, {2, 64, 512}, {256, 1000}, {3, 7}, {4, 8192}}) {
      const Tensor g = rnd(shape, 51, dtype), x = rnd(shape, 52, dtype);
      const Tensor w = rnd({shape.back()}, 53, dtype), b = rnd({shape.back()}, 54, dtype);
      const TensorSpec spec = spec_of(x), param = spec_of(w);
      const Op norm{.type = OpType::kLayerNorm, .eps = 1e-3},
          stats{.type = OpType::kLayerNormStats, .eps = 1e-3};
      const Tensor s = run_kernel(stats, {&x}, {spec});
      const Op gw{.type = OpType::kLayerNormGradW},
          gb{.type = OpType::kSumTo, .shape = {shape.back()}};
      struct Pair {
        Op first, second;
        std::vector<const Tensor*> in;
      };
      for (const Pair& p : {Pair{norm, stats, {&x, &w, &b}}, Pair{gw, gb, {&g, &x, &s}}}) {
        std::vector<TensorSpec> specs;
        for (const Tensor* t : p.in) specs.push_back(spec_of(*t));
        ASSERT_TRUE(runs_together(p.first, p.second, specs) &&
                    runs_together(p.second, p.first, specs));
        const Tensor first_alone = run_kernel(p.first, p.in, specs);
        const std::vector<const Tensor*> prefix = {p.in[0]};
        const Tensor second_alone = run_kernel(p.second, prefix, {specs[0]});
        for (bool on_team : {false, true})
          for (bool swap : {false, true}) {
            const std::vector<Op> ops =
                swap ? std::vector<Op>{p.second, p.first} : std::vector<Op>{p.first, p.second};
            std::vector<Tensor> together;
            {
              const UseTeam use(on_team ? &team : nullptr);
              together = run_kernels(ops, p.in, specs);
            }
            const std::string what =
                fmt::format("{} {} {}{}{}", to_string(p.first.type), to_string(dtype),
                            to_string(shape), on_team ? " on a team" : "", swap ? ", swapped" : "");
            const std::optional<std::string> d1 =
                compare_exact(together[swap ? 1 : 0], first_alone);
            const std::optional<std::string> d2 =
                compare_exact(together[swap ? 0 : 1], second_alone);
            EXPECT_FALSE(d1) << what << ": " << *d1;
            EXPECT_FALSE(d2) << what << ": " << *d2;
          }
      }
      // Not together: statistics of another eps.
      EXPECT_FALSE(runs_together(norm, Op{.type = OpType::kLayerNormStats}, {spec, param, param}));
    }
  // Not together: a sum to another shape, or over operands that are not (g, x, stats) alike.
  const TensorSpec s{{4, 6}, DType::kFloat32}, st{{4, 3}, DType::kFloat32};
  const Op gw{.type = OpType::kLayerNormGradW};
  EXPECT_FALSE(runs_together(gw, Op{.type = OpType::kSumTo, .shape = {1, 6}}, {s, s, st}));
  EXPECT_FALSE(runs_together(gw, Op{.type = OpType::kSumTo, .shape = {6}},
                             {s, {{4, 6}, DType::kFloat64}, st}));
  EXPECT_FALSE(runs_together(gw, gw, {s, s, st}));
}

// A device's team (kernels/parallel.h) splits each kernel into parts: float32 results at sizes
// that split equal the kernel's alone, bit for bit where each element is computed the same way
// (elementwise, rows, attention's heads, sums in blocks fixed by the shape) and to rounding where
// parts sum separately (the loss, a GEMM split by columns).
TEST(Kernels, EveryKernelATeamSplitsAgreesWithItAlone) {
  const DType f = DType::kFloat32;
  const Tensor x = rnd({256, 1024}, 1, f), g = rnd({256, 1024}, 2, f), w = rnd({1024}, 3, f);
  const Tensor b = rnd({1024}, 4, f), wm = rnd({1024, 384}, 5, f), wide = rnd({384, 1024}, 6, f);
  const Tensor labels = ids({256}, 1024), one = rnd({}, 7, f);
  const Tensor q = rnd({2, 4, 80, 16}, 8, f), k = rnd({2, 4, 80, 16}, 9, f);
  const Tensor v = rnd({2, 4, 80, 16}, 10, f), ga = rnd({2, 4, 80, 16}, 11, f);
  const Tensor bias3 = rnd({1, 1024}, 12, f), x3 = rnd({8, 32, 1024}, 13, f);
  const Tensor tokens = ids({2048}, 1024), table = rnd({1024, 256}, 14, f);
  const Tensor g_rows = rnd({2048, 256}, 15, f);
  const Tensor norm_stats = run({.type = OpType::kLayerNormStats}, {&x});
  struct Case {
    Op op;
    std::vector<const Tensor*> in;
    bool exact;
  };
  const std::vector<Case> cases = {
      {Op{.type = OpType::kGelu}, {&x}, true},
      {Op{.type = OpType::kRelu}, {&x}, true},
      {Op{.type = OpType::kGeluGrad}, {&g, &x}, true},
      {Op{.type = OpType::kAdd}, {&x, &g}, true},
      {Op{.type = OpType::kMul}, {&x3, &bias3}, true},  // broadcast rows, odometer per part
      {Op{.type = OpType::kSoftmax, .dim = 1}, {&x}, true},
      {Op{.type = OpType::kSoftmaxCrossEntropy}, {&x, &labels}, false},
      {Op{.type = OpType::kSoftmaxCrossEntropyGrad}, {&x, &labels, &one}, true},
      {Op{.type = OpType::kLayerNorm}, {&x, &w, &b}, true},
      {Op{.type = OpType::kLayerNormStats}, {&x}, true},
      {Op{.type = OpType::kLayerNormGradX}, {&g, &x, &w, &norm_stats}, true},
      {Op{.type = OpType::kLayerNormGradW}, {&g, &x, &norm_stats}, true},  // sum_rows' row blocks
      {Op{.type = OpType::kSumTo, .shape = {1024}}, {&x}, true},  // rows added, columns split
      {Op{.type = OpType::kSum, .dims = {0, 1}}, {&x3}, true},
      {Op{.type = OpType::kTranspose, .dims = {1, 0}}, {&x}, true},
      {Op{.type = OpType::kEmbedding}, {&tokens, &table}, true},
      {Op{.type = OpType::kEmbeddingGrad, .shape = {1024, 256}}, {&tokens, &g_rows}, true},
      {Op{.type = OpType::kTranspose, .dims = {0, 2, 1, 3}}, {&q}, true},
      {Op{.type = OpType::kMatmul}, {&x, &wm}, false},
      {Op{.type = OpType::kMatmulGradB}, {&x, &g}, false},
      {Op{.type = OpType::kMatmulGradA}, {&g, &wide}, false},
      {Op{.type = OpType::kAttention, .causal = true}, {&q, &k, &v}, true},
      {Op{.type = OpType::kAttentionGradQ, .causal = true}, {&q, &k, &v, &ga}, true},
      {Op{.type = OpType::kAttentionGradK, .causal = true}, {&q, &k, &v, &ga}, true},
      {Op{.type = OpType::kAttentionGradV, .causal = true}, {&q, &k, &v, &ga}, true},
  };
  ThreadTeam team(3);
  for (const Case& c : cases) {
    const Tensor alone = run(c.op, c.in);
    Tensor split;
    {
      const UseTeam use(&team);
      split = run(c.op, c.in);
    }
    const std::optional<std::string> diff =
        c.exact ? compare_exact(split, alone) : compare_close(split, alone, 1e-5, 1e-5);
    EXPECT_FALSE(diff) << to_string(c.op) << ": " << *diff;
  }
}

TEST(Kernels, IntegerArithmeticWrapsAroundAsNumPys) {
  Tensor a(DType::kInt32, {2}), b(DType::kInt32, {2});
  a.data<std::int32_t>()[0] = 2147483647;
  a.data<std::int32_t>()[1] = -5;
  b.data<std::int32_t>()[0] = 1;
  b.data<std::int32_t>()[1] = 7;
  const Tensor c = run({.type = OpType::kAdd}, {&a, &b});
  EXPECT_EQ(c.data<std::int32_t>()[0], -2147483647 - 1);
  EXPECT_EQ(c.data<std::int32_t>()[1], 2);
  const Tensor s = run({.type = OpType::kSum, .dims = {0}}, {&a});
  EXPECT_EQ(s.data<std::int32_t>()[0], 2147483642);
}

template <typename... T>
std::vector<Tensor> tensors(T&&... t) {
  std::vector<Tensor> v;
  (v.push_back(std::move(t)), ...);
  return v;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += at(a, i) * at(b, i);
  return s;
}

// For L(x) = <g, op(x)>, checks <grad_i, v> against (L(x_i + εv) - L(x_i - εv)) / 2ε for a
// random direction v, for every float operand i.
void check_gradients(const Op& op, std::vector<Tensor> in) {
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : in) ptrs.push_back(&t);
  const Tensor out = compute(op, ptrs);
  const Tensor g = rnd(out.shape(), 99);
  const auto grads = compute_backward(op, ptrs, out, g);
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!is_floating(in[i].dtype())) {
      EXPECT_FALSE(grads[i].has_value());
      continue;
    }
    ASSERT_TRUE(grads[i].has_value());
    ASSERT_EQ(grads[i]->shape(), in[i].shape()) << to_string(op) << " operand " << i;
    const Tensor v = rnd(in[i].shape(), 100 + i);
    const double eps = 1e-6;
    auto loss_at = [&](double sign) {
      Tensor moved = in[i].clone();
      for (std::int64_t k = 0; k < moved.numel(); ++k)
        moved.data<double>()[static_cast<std::size_t>(k)] += sign * eps * at(v, k);
      std::vector<const Tensor*> p2 = ptrs;
      p2[i] = &moved;
      return dot(g, compute(op, p2));
    };
    const double numeric = (loss_at(1) - loss_at(-1)) / (2 * eps);
    EXPECT_NEAR(dot(*grads[i], v), numeric, 1e-6 * (1 + std::abs(numeric)))
        << to_string(op) << " operand " << i;
  }
}

TEST(Gradients, EveryForwardOperatorMatchesFiniteDifferences) {
  check_gradients({.type = OpType::kMatmul}, tensors(rnd({2, 3, 4}, 1), rnd({4, 5}, 2)));
  check_gradients({.type = OpType::kLinear}, tensors(rnd({3, 4}, 1), rnd({4, 5}, 2), rnd({5}, 3)));
  check_gradients({.type = OpType::kLinear}, tensors(rnd({4}, 1), rnd({4, 5}, 2)));
  // The products a folded transpose makes (graph/passes.h's fold_transposes): a @ bᵀ, aᵀ @ b.
  check_gradients({.type = OpType::kMatmulGradA}, tensors(rnd({2, 3, 4}, 1), rnd({5, 4}, 2)));
  check_gradients({.type = OpType::kMatmulGradB}, tensors(rnd({2, 3, 4}, 1), rnd({2, 3, 5}, 2)));
  for (OpType t : {OpType::kAdd, OpType::kSub, OpType::kMul, OpType::kDiv}) {
    check_gradients({.type = t}, tensors(rnd({3, 4}, 4), rnd({4}, 5)));
    check_gradients({.type = t}, tensors(rnd({3, 1}, 6), rnd({2, 1, 4}, 7)));
  }
  for (OpType t :
       {OpType::kNeg, OpType::kRelu, OpType::kGelu, OpType::kTanh, OpType::kSigmoid, OpType::kExp})
    check_gradients({.type = t}, tensors(rnd({3, 4}, 8)));
  check_gradients({.type = OpType::kGelu, .approximate_tanh = true}, tensors(rnd({3, 4}, 8)));
  check_gradients({.type = OpType::kSum, .dims = {0, 2}}, tensors(rnd({2, 3, 4}, 9)));
  check_gradients({.type = OpType::kMean, .dims = {1}}, tensors(rnd({2, 3, 4}, 10)));
  check_gradients({.type = OpType::kSoftmax, .dim = 1}, tensors(rnd({3, 4}, 11)));
  Tensor labels(DType::kInt32, {3});
  for (int i = 0; i < 3; ++i) labels.data<std::int32_t>()[i] = (i * 3) % 4;
  std::vector<Tensor> sce;
  sce.push_back(rnd({3, 4}, 12));
  sce.push_back(std::move(labels));
  check_gradients({.type = OpType::kSoftmaxCrossEntropy}, std::move(sce));
  check_gradients({.type = OpType::kMse}, tensors(rnd({3, 4}, 13), rnd({3, 4}, 14)));
  check_gradients({.type = OpType::kLayerNorm, .eps = 1e-3},
                  tensors(rnd({2, 3, 5}, 17), rnd({5}, 18), rnd({5}, 19)));
  check_gradients({.type = OpType::kEmbedding}, tensors(ids({2, 3}, 7), rnd({7, 4}, 20)));
  for (bool causal : {false, true}) {
    check_gradients({.type = OpType::kAttention, .causal = causal},
                    tensors(rnd({2, 5, 3}, 22), rnd({2, 5, 3}, 23), rnd({2, 5, 4}, 24)));
  }
  check_gradients({.type = OpType::kAttention},
                  tensors(rnd({3, 3}, 25), rnd({6, 3}, 26), rnd({6, 2}, 27)));
  check_gradients({.type = OpType::kReshape, .shape = {4, -1}}, tensors(rnd({2, 3, 4}, 15)));
  check_gradients({.type = OpType::kTranspose, .dims = {1, 2, 0}}, tensors(rnd({2, 3, 4}, 16)));
  // For models brought from PyTorch: a slice, and linear of an [out, in] weight.
  check_gradients({.type = OpType::kSlice, .dim = 1, .start = 1, .end = -1},
                  tensors(rnd({2, 5, 3}, 28)));
  check_gradients({.type = OpType::kLinear, .weight_out_in = true},
                  tensors(rnd({2, 3, 4}, 29), rnd({5, 4}, 30), rnd({5}, 31)));
}

TEST(Kernels, LinearOfAnOutInWeightIsLinearOfItsTranspose) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = rnd({2, 3, 4}, 40, dtype), w = rnd({5, 4}, 41, dtype), b = rnd({5}, 42, dtype);
    const Tensor wt = run({.type = OpType::kTranspose, .dims = {1, 0}}, {&w});
    const Tensor want = run({.type = OpType::kLinear}, {&x, &wt, &b});
    const Tensor got = run({.type = OpType::kLinear, .weight_out_in = true}, {&x, &w, &b});
    ASSERT_EQ(got.shape(), (Shape{2, 3, 5}));
    std::vector<double> expected;
    for (std::int64_t i = 0; i < want.numel(); ++i) expected.push_back(at(want, i));
    expect_near(got, expected, dtype == DType::kFloat32 ? 1e-6 : 1e-14, "linear out_in");
    // Its rule: x's in dim pairs with the weight's dim 1, the result's last dim with dim 0.
    const DimLabels l = dim_labels({.type = OpType::kLinear, .weight_out_in = true},
                                   {spec_of(x), spec_of(w), spec_of(b)});
    EXPECT_EQ(l.inputs[1], (std::vector<int>{2, 3}));
    EXPECT_EQ(l.inputs[0].back(), 3);
    EXPECT_EQ(l.output.back(), 2);
  }
  EXPECT_EQ(error_of([] {
              infer({.type = OpType::kLinear, .weight_out_in = true}, {{{3, 4}}, {{4, 5}}});
            }),
            "linear: operand shapes 3x4, 4x5 do not fit x[..., in] @ w[out, in]ᵀ + b[out]");
}

TEST(Kernels, BadOperandsAreOneClearErrorNamingTheOperator) {
  const Tensor a = rnd({3, 4}, 1), b = rnd({5, 2}, 2);
  Tensor i(DType::kInt32, {3, 4});
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kMatmul}, {&a, &b});
            }),
            "matmul: operand shapes 3x4, 5x2 do not fit a[..., m, k] @ b[k, n]");
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kAdd}, {&a, &b});
            }),
            "add: shapes 3x4 and 5x2 do not broadcast (dim 0: 3 vs 5)");
  EXPECT_EQ(error_of([&] { run({.type = OpType::kRelu}, {&i}); }),
            "relu: operand 0 is int32; relu takes float32 or float64");
  EXPECT_EQ(error_of([&] { run({.type = OpType::kSum, .dims = {2}}, {&a}); }),
            "sum: dim 2 is out of range for a 2-d operand");
  EXPECT_EQ(error_of([&] { run({.type = OpType::kAdd}, {&a}); }), "add takes 2 operands, got 1");
  const Tensor w = rnd({3}, 3);
  const Tensor q = rnd({2, 3, 4}, 4), kk = rnd({2, 5, 3}, 5);
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kAttention}, {&q, &kk, &kk});
            }),
            "attention: q 2x3x4, k 2x5x3, v 2x5x3 disagree in Dk (the last dim of q and k)");
  Tensor bad_ids(DType::kInt64, {2});
  bad_ids.data<std::int64_t>()[1] = 4;
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kEmbedding}, {&bad_ids, &a});
            }),
            "embedding: id 4 is out of range for a table of 3 rows");
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kEmbedding}, {&a, &a});
            }),
            "embedding: ids are float64; they must be int32 or int64");
  EXPECT_EQ(error_of([&] {
              run({.type = OpType::kLayerNorm}, {&a, &w, &w});
            }),
            "layer_norm: operand 1 is 3 but x 3x4 needs 4");
}

}  // namespace
}  // namespace meshflow
