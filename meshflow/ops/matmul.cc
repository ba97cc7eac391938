#include "meshflow/ops/matmul.h"

#include <algorithm>
#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow {

bool is_matmul_family(OpType t) {
  return t == OpType::kMatmul || t == OpType::kLinear || t == OpType::kMatmulGradA ||
         t == OpType::kMatmulGradB;
}

namespace {

std::int64_t leading(const Shape& s, std::size_t keep) {
  std::int64_t m = 1;
  for (std::size_t i = 0; i + keep < s.size(); ++i) m *= s[i];
  return m;
}

[[noreturn]] void mismatch(std::string_view name, const std::vector<TensorSpec>& in,
                           std::string_view expected) {
  std::string shapes;
  for (const TensorSpec& s : in) shapes += (shapes.empty() ? "" : ", ") + to_string(s.shape);
  fail(ErrorKind::kShapeMismatch, "{}: operand shapes {} do not fit {}", name, shapes, expected);
}

}  // namespace

TensorSpec infer_matmul(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, in, /*floating_only=*/true);
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  switch (op.type) {
    case OpType::kMatmul: {
      if (a.size() < 2 || b.size() != 2 || a.back() != b[0])
        mismatch(name, in, "a[..., m, k] @ b[k, n]");
      Shape out = a;
      out.back() = b[1];
      return {out, in[0].dtype};
    }
    case OpType::kLinear: {
      const std::size_t k = op.weight_out_in ? 1 : 0;  // w's in dim
      if (a.empty() || b.size() != 2 || a.back() != b[k] ||
          (in.size() == 3 && in[2].shape != Shape{b[1 - k]}))
        mismatch(name, in,
                 op.weight_out_in ? "x[..., in] @ w[out, in]ᵀ + b[out]"
                                  : "x[..., in] @ w[in, out] + b[out]");
      Shape out = a;
      out.back() = b[1 - k];
      return {out, in[0].dtype};
    }
    case OpType::kMatmulGradA: {  // (g[..., m, n], b[k, n]) -> [..., m, k]
      if (a.empty() || b.size() != 2 || a.back() != b[1])
        mismatch(name, in, "g[..., m, n] with b[k, n]");
      Shape out = a;
      out.back() = b[0];
      return {out, in[0].dtype};
    }
    case OpType::kMatmulGradB: {  // (a[..., m, k], g[..., m, n]) -> [k, n]
      if (a.empty() || b.empty() || a.size() != b.size() ||
          !std::equal(a.begin(), a.end() - 1, b.begin()))
        mismatch(name, in, "a[..., m, k] with g[..., m, n]");
      return {{a.back(), b.back()}, in[0].dtype};
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a matrix product", name);
  }
}

bool is_row_product(OpType type) {
  return type == OpType::kMatmul || type == OpType::kLinear || type == OpType::kMatmulGradA;
}

std::int64_t row_product_width(const Op& op, const Shape& b) {
  MESHFLOW_CHECK(is_row_product(op.type) && b.size() == 2);
  return op.type == OpType::kMatmulGradA || op.weight_out_in ? b[0] : b[1];
}

template <typename T>
void row_product(const Op& op, const T* a, std::int64_t m, std::int64_t a_width, const Tensor& b,
                 const Tensor* bias, T* out, bool accumulate) {
  const T* pb = reinterpret_cast<const T*>(b.bytes());
  const std::int64_t n = row_product_width(op, b.shape());
  const T beta = accumulate ? T(1) : T(0);
  // g[m, a_width] @ b[n, a_width]ᵀ: matmul_grad_a, and linear of an [out, in] weight
  const bool b_transposed = op.type == OpType::kMatmulGradA || op.weight_out_in;
  const std::int64_t ldb = b_transposed ? a_width : n;
  if (bias == nullptr) {
    gemm<T>(false, b_transposed, m, n, a_width, a, a_width, pb, ldb, beta, out, n);
    return;
  }
  // Start from (or add) the bias in every row, then add the product.
  const T* pbias = reinterpret_cast<const T*>(bias->bytes());
  for (std::int64_t i = 0; i < m; ++i) {
    T* row = out + i * n;
    if (accumulate) {
      for (std::int64_t j = 0; j < n; ++j) row[j] += pbias[j];
    } else {
      std::memcpy(row, pbias, static_cast<std::size_t>(n) * sizeof(T));
    }
  }
  gemm<T>(false, b_transposed, m, n, a_width, a, a_width, pb, ldb, T(1), out, n);
}

template void row_product<float>(const Op&, const float*, std::int64_t, std::int64_t, const Tensor&,
                                 const Tensor*, float*, bool);
template void row_product<double>(const Op&, const double*, std::int64_t, std::int64_t,
                                  const Tensor&, const Tensor*, double*, bool);

namespace {

// out (= or +=, `accumulate`) the product of `in`; out has the result's shape.
void matmul_into(const Op& op, const std::vector<const Tensor*>& in, Tensor& out, bool accumulate) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* pa = reinterpret_cast<const T*>(a.bytes());
      const T* pb = reinterpret_cast<const T*>(b.bytes());
      T* pc = reinterpret_cast<T*>(out.bytes());
      const Shape& as = a.shape();
      const Shape& bs = b.shape();
      switch (op.type) {
        case OpType::kMatmul:
        case OpType::kLinear:
        case OpType::kMatmulGradA:
          row_product<T>(op, pa, leading(as, 1), as.back(), b, in.size() == 3 ? in[2] : nullptr, pc,
                         accumulate);
          break;
        case OpType::kMatmulGradB: {
          const std::int64_t rows = leading(as, 1), k = as.back(), n = bs.back();
          gemm<T>(true, false, k, n, rows, pa, k, pb, n, accumulate ? T(1) : T(0), pc, n);
          break;
        }
        default:
          MESHFLOW_CHECK(false, "{} is not a matrix product", to_string(op.type));
      }
    } else {
      MESHFLOW_CHECK(false, "integer {}", to_string(op.type));
    }
  });
}

TensorSpec result_spec(const Op& op, const std::vector<const Tensor*>& in) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : in) specs.push_back(spec_of(*t));
  return infer_matmul(op, specs);
}

}  // namespace

Tensor matmul_kernel(const Op& op, const std::vector<const Tensor*>& in) {
  const TensorSpec out_spec = result_spec(op, in);
  Tensor out = Tensor::uninitialized(out_spec.dtype, out_spec.shape);
  matmul_into(op, in, out, /*accumulate=*/false);
  return out;
}

void matmul_kernel_accumulate(const Op& op, const std::vector<const Tensor*>& in, Tensor& sum) {
  const TensorSpec out_spec = result_spec(op, in);
  MESHFLOW_CHECK(sum.shape() == out_spec.shape && sum.dtype() == out_spec.dtype,
                 "{}: accumulating a {} result into {}", to_string(op.type),
                 to_string(out_spec.shape), to_string(sum.shape()));
  matmul_into(op, in, sum, /*accumulate=*/true);
}

DimLabels matmul_labels(const Op& op, const std::vector<TensorSpec>& in, const Shape& out) {
  DimLabels l;
  const int r = static_cast<int>(out.size());
  switch (op.type) {
    case OpType::kMatmul: {  // a[..., m, k] b[k, n]: k is label r
      std::vector<int> a = label_range(0, r - 1);
      a.push_back(r);
      l.inputs = {a, {r, r - 1}};
      l.output = label_range(0, r);
      l.factors = {0, 1};
      return l;
    }
    case OpType::kLinear: {  // x[..., in] w[in, out] b[out]: in is label r
      std::vector<int> x = label_range(0, r - 1);
      x.push_back(r);
      l.inputs = {x, op.weight_out_in ? std::vector<int>{r - 1, r} : std::vector<int>{r, r - 1}};
      if (in.size() == 3) l.inputs.push_back({r - 1});
      l.output = label_range(0, r);
      l.factors = {0, 1};
      if (in.size() == 3) l.terms = {2};
      return l;
    }
    case OpType::kMatmulGradA: {  // g[..., m, n] b[k, n] -> [..., m, k]: n is label r
      std::vector<int> g = label_range(0, r - 1);
      g.push_back(r);
      l.inputs = {g, {r - 1, r}};
      l.output = label_range(0, r);
      l.factors = {0, 1};
      return l;
    }
    case OpType::kMatmulGradB: {  // a[..., m, k] g[..., m, n] -> [k, n]
      const int ra = static_cast<int>(in[0].shape.size());
      std::vector<int> a = label_range(2, ra + 1), g = label_range(2, ra + 1);
      a.push_back(0);
      g.push_back(1);
      l.inputs = {a, g};
      l.output = {0, 1};
      l.factors = {0, 1};
      return l;
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a matrix product", to_string(op.type));
  }
}

}  // namespace meshflow
