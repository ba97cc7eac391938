#include "meshflow/ops/elementwise.h"

#include <cmath>
#include <numbers>
#include <type_traits>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow {

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t x = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::int64_t y = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (x != y && x != 1 && y != 1) {
      fail(ErrorKind::kShapeMismatch, "{}: shapes {} and {} do not broadcast (dim {}: {} vs {})",
           what, to_string(a), to_string(b), i, x, y);
    }
    out[i] = x == 1 ? y : x;
  }
  return out;
}

bool is_binary(OpType t) {
  return t == OpType::kAdd || t == OpType::kSub || t == OpType::kMul || t == OpType::kDiv;
}
bool is_unary(OpType t) {
  return t == OpType::kNeg || t == OpType::kRelu || t == OpType::kGelu || t == OpType::kTanh ||
         t == OpType::kSigmoid || t == OpType::kExp;
}
bool is_unary_grad(OpType t) {
  return t == OpType::kReluGrad || t == OpType::kGeluGrad || t == OpType::kTanhGrad ||
         t == OpType::kSigmoidGrad;
}

namespace {

// add, sub, mul and neg also take integers (NumPy's wrap-around arithmetic); the rest are
// floating-point only.
bool takes_integers(OpType t) {
  return t == OpType::kAdd || t == OpType::kSub || t == OpType::kMul || t == OpType::kNeg;
}

template <typename T>
T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
}
template <typename T>
T gelu_derivative(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
  return cdf + x * pdf;
}

// PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh(u)), u = √(2/π) (x + 0.044715 x³), and
// its derivative 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3 · 0.044715 x²), t = tanh(u).
template <typename T>
constexpr T kSqrt2OverPi = T(std::numbers::sqrt2* std::numbers::inv_sqrtpi);  // √(2/π)
template <typename T>
T gelu_tanh_t(T x) {
  return std::tanh(kSqrt2OverPi<T> * (x + T(0.044715) * x * x * x));
}
template <typename T>
T gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + gelu_tanh_t(x));
}
template <typename T>
T gelu_tanh_derivative(T x) {
  const T t = gelu_tanh_t(x);
  return T(0.5) * (T(1) + t) +
         T(0.5) * x * (T(1) - t * t) * kSqrt2OverPi<T> * (T(1) + T(3 * 0.044715) * x * x);
}

// out = f(a, b) over the broadcast of a and b. The innermost dim is one loop with constant
// strides; the outer dims walk an odometer.
template <typename T, typename F>
void broadcast_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* pa = reinterpret_cast<const T*>(a.bytes());
  const T* pb = reinterpret_cast<const T*>(b.bytes());
  T* po = reinterpret_cast<T*>(out.bytes());
  const std::int64_t n = out.numel();
  if (n == 0) return;
  if (a.shape() == b.shape()) {
    parallel_for(n, kElementGrain, [=](std::int64_t begin, std::int64_t end) {
      T* __restrict o = po;  // locals: the loop reads no pointer through the closure
      const T* x = pa;
      const T* y = pb;
      for (std::int64_t i = begin; i < end; ++i) o[i] = f(x[i], y[i]);
    });
    return;
  }
  const Shape& shape = out.shape();
  const std::size_t rank = shape.size();
  // Strides of a and b over the output's dims (0 where broadcast or missing).
  auto strides_of = [&](const Shape& s) {
    std::vector<std::int64_t> st(rank, 0);
    std::int64_t acc = 1;
    for (std::size_t i = s.size(); i-- > 0;) {
      const std::size_t o = i + (rank - s.size());
      st[o] = s[i] == 1 ? 0 : acc;
      acc *= s[i];
    }
    return st;
  };
  const auto sa = strides_of(a.shape()), sb = strides_of(b.shape());
  const std::int64_t inner = shape[rank - 1];
  const std::int64_t ia = sa[rank - 1], ib = sb[rank - 1];
  // Rows split over the device's threads; each part starts its odometer at its first row.
  const std::int64_t rows = n / inner;
  parallel_for(rows, row_grain(inner), [&](std::int64_t first, std::int64_t last) {
    std::vector<std::int64_t> index = row_start_index(shape, first);
    std::int64_t oa = 0, ob = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      oa += index[d] * sa[d];
      ob += index[d] * sb[d];
    }
    for (std::int64_t row = first; row < last; ++row) {
      T* o = po + row * inner;
      const T* x = pa + oa;
      const T* y = pb + ob;
      if (ia == 1 && ib == 1) {
        for (std::int64_t i = 0; i < inner; ++i) o[i] = f(x[i], y[i]);
      } else if (ia == 1 && ib == 0) {
        const T yv = *y;
        for (std::int64_t i = 0; i < inner; ++i) o[i] = f(x[i], yv);
      } else if (ia == 0 && ib == 1) {
        const T xv = *x;
        for (std::int64_t i = 0; i < inner; ++i) o[i] = f(xv, y[i]);
      } else {
        for (std::int64_t i = 0; i < inner; ++i) o[i] = f(x[i * ia], y[i * ib]);
      }
      for (std::size_t d = rank - 1; d-- > 0;) {
        oa += sa[d];
        ob += sb[d];
        if (++index[d] < shape[d]) break;
        oa -= sa[d] * shape[d];
        ob -= sb[d] * shape[d];
        index[d] = 0;
      }
    }
  });
}

template <typename T, typename F>
void unary_loop(const Tensor& a, Tensor& out, F f) {
  const T* pa = reinterpret_cast<const T*>(a.bytes());
  T* po = reinterpret_cast<T*>(out.bytes());
  parallel_for(out.numel(), kElementGrain, [=](std::int64_t begin, std::int64_t end) {
    T* __restrict o = po;  // locals: the loop reads no pointer through the closure
    const T* __restrict x = pa;
    for (std::int64_t i = begin; i < end; ++i) o[i] = f(x[i]);
  });
}

template <typename T>
void binary(const Op& op, const Tensor& a, const Tensor& b, Tensor& out) {
  const OpType type = op.type;
  if constexpr (std::is_same_v<T, float>) {
    if (type == OpType::kGeluGrad) {  // g and x of one shape (infer_elementwise checks)
      const auto* g = reinterpret_cast<const float*>(a.bytes());
      const auto* x = reinterpret_cast<const float*>(b.bytes());
      auto* y = reinterpret_cast<float*>(out.bytes());
      const auto f = op.approximate_tanh ? vector_math().gelu_tanh_grad : vector_math().gelu_grad;
      parallel_for(out.numel(), kElementGrain, [&](std::int64_t begin, std::int64_t end) {
        f(g + begin, x + begin, y + begin, end - begin);
      });
      return;
    }
  }
  if (type == OpType::kGeluGrad && op.approximate_tanh) {
    return broadcast_loop<T>(a, b, out, [](T g, T x) { return T(g * gelu_tanh_derivative(x)); });
  }
  switch (type) {
    case OpType::kAdd:
      return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(x + y); });
    case OpType::kSub:
      return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(x - y); });
    case OpType::kMul:
      return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(x * y); });
    case OpType::kDiv:
      return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(x / y); });
    case OpType::kReluGrad:
      return broadcast_loop<T>(a, b, out, [](T g, T x) { return x > T(0) ? g : T(0); });
    case OpType::kGeluGrad:
      return broadcast_loop<T>(a, b, out, [](T g, T x) { return T(g * gelu_derivative(x)); });
    case OpType::kTanhGrad:
      return broadcast_loop<T>(a, b, out, [](T g, T y) { return T(g * (T(1) - y * y)); });
    case OpType::kSigmoidGrad:
      return broadcast_loop<T>(a, b, out, [](T g, T y) { return T(g * y * (T(1) - y)); });
    default:
      MESHFLOW_CHECK(false, "{} is not a binary elementwise operator", to_string(type));
  }
}

// Returns the vector loop of float32 unary `op`, or null where the scalar loop serves.
using VectorUnary = void (*)(const float*, float*, std::int64_t);
VectorUnary vector_unary(const Op& op) {
  const VectorMath& m = vector_math();
  switch (op.type) {
    case OpType::kGelu:
      return op.approximate_tanh ? m.gelu_tanh : m.gelu;
    case OpType::kTanh:
      return m.tanh;
    case OpType::kSigmoid:
      return m.sigmoid;
    case OpType::kExp:
      return m.exp;
    default:
      return nullptr;
  }
}

template <typename T>
void unary(const Op& op, const Tensor& a, Tensor& out) {
  const OpType type = op.type;
  if constexpr (std::is_same_v<T, float>) {
    if (const VectorUnary f = vector_unary(op)) {
      const auto* x = reinterpret_cast<const float*>(a.bytes());
      auto* y = reinterpret_cast<float*>(out.bytes());
      parallel_for(out.numel(), kElementGrain, [&](std::int64_t begin, std::int64_t end) {
        f(x + begin, y + begin, end - begin);
      });
      return;
    }
  }
  if (type == OpType::kGelu && op.approximate_tanh)
    return unary_loop<T>(a, out, [](T x) { return gelu_tanh(x); });
  switch (type) {
    case OpType::kNeg:
      return unary_loop<T>(a, out, [](T x) { return T(-x); });
    case OpType::kRelu:
      return unary_loop<T>(a, out, [](T x) { return x > T(0) ? x : T(0); });
    case OpType::kGelu:
      return unary_loop<T>(a, out, [](T x) { return gelu(x); });
    case OpType::kTanh:
      return unary_loop<T>(a, out, [](T x) { return std::tanh(x); });
    case OpType::kSigmoid:
      return unary_loop<T>(a, out, [](T x) { return T(1) / (T(1) + std::exp(-x)); });
    case OpType::kExp:
      return unary_loop<T>(a, out, [](T x) { return std::exp(x); });
    default:
      MESHFLOW_CHECK(false, "{} is not a unary elementwise operator", to_string(type));
  }
}

}  // namespace

TensorSpec infer_elementwise(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, in, !takes_integers(op.type));
  if (is_unary(op.type)) return in[0];
  if (is_unary_grad(op.type) && in[0].shape != in[1].shape) {
    fail(ErrorKind::kShapeMismatch, "{}: gradient {} and value {} differ in shape", name,
         to_string(in[0].shape), to_string(in[1].shape));
  }
  return {broadcast_shapes(in[0].shape, in[1].shape, name), in[0].dtype};
}

Tensor elementwise_kernel(const Op& op, const std::vector<const Tensor*>& in) {
  const Tensor& a = *in[0];
  if (is_unary(op.type)) {
    Tensor out = Tensor::uninitialized(a.dtype(), a.shape());
    visit_dtype(a.dtype(), [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_floating_point_v<T>) {
        unary<T>(op, a, out);
      } else {
        MESHFLOW_CHECK(op.type == OpType::kNeg, "integer {}", to_string(op.type));
        unary_loop<T>(a, out, [](T x) { return T(-std::make_unsigned_t<T>(x)); });
      }
    });
    return out;
  }
  const Tensor& b = *in[1];
  Tensor out = Tensor::uninitialized(a.dtype(), broadcast_shapes(a.shape(), b.shape(), "kernel"));
  visit_dtype(a.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<T>) {
      binary<T>(op, a, b, out);
    } else {
      // Integers wrap around as NumPy's do: the arithmetic runs unsigned, where overflow is
      // defined.
      using U = std::make_unsigned_t<T>;
      switch (op.type) {
        case OpType::kAdd:
          return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(U(x) + U(y)); });
        case OpType::kSub:
          return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(U(x) - U(y)); });
        case OpType::kMul:
          return broadcast_loop<T>(a, b, out, [](T x, T y) { return T(U(x) * U(y)); });
        default:
          MESHFLOW_CHECK(false, "integer {}", to_string(op.type));
      }
    }
  });
  return out;
}

DimLabels elementwise_labels(const Op& op, const std::vector<TensorSpec>& in, const Shape& out) {
  DimLabels l;
  const int r = static_cast<int>(out.size());
  switch (op.type) {
    case OpType::kAdd:
    case OpType::kSub:
    case OpType::kMul:
    case OpType::kDiv:
      l.inputs = {broadcast_labels(in[0].shape, out), broadcast_labels(in[1].shape, out)};
      l.output = label_range(0, r);
      if (op.type == OpType::kAdd || op.type == OpType::kSub) l.terms = {0, 1};
      if (op.type == OpType::kMul) l.factors = {0, 1};
      if (op.type == OpType::kDiv) l.factors = {0};
      return l;
    default:  // unary elementwise operators and their gradients
      l.inputs.assign(in.size(), label_range(0, r));
      l.output = label_range(0, r);
      if (op.type == OpType::kNeg) l.terms = {0};
      if (is_unary_grad(op.type)) l.factors = {0};
      return l;
  }
}

}  // namespace meshflow
