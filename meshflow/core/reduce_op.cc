// ReduceOp names.
#include "meshflow/core/reduce_op.h"

#include "meshflow/core/error.h"

namespace meshflow {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (to_string(op) == name) return op;
  }
  fail(ErrorKind::kInvalidArgument, "unknown reduce op \"{}\" (expected sum, avg, max or min)",
       name);
}

}  // namespace meshflow

#include <algorithm>
#include <cstring>
#include <vector>

namespace meshflow {

namespace {

// Elements per tile: the accumulator lives on the stack so `out` may alias a term.
constexpr std::int64_t kReduceTile = 2048;

// Per tile of kReduceTile elements: acc = t0 op t1, then acc = acc op tk for the middle terms,
// and the last term is combined straight into `out`: one pass over each term, n - 1 passes over
// an L1-resident tile, and `out` written once (after every term of that tile was read).
template <typename T, typename Combine>
void reduce_typed_body(std::span<const std::byte* const> terms, std::byte* out, std::int64_t n,
                       Combine combine) {
  alignas(64) T acc[kReduceTile];
  T* dst = reinterpret_cast<T*>(out);
  const std::size_t k_terms = terms.size();
  auto term = [&](std::size_t k, std::int64_t base) {
    return reinterpret_cast<const T*>(terms[k]) + base;
  };
  for (std::int64_t base = 0; base < n; base += kReduceTile) {
    const std::int64_t len = std::min(kReduceTile, n - base);
    if (k_terms == 1) {
      const T* a = term(0, base);
      std::copy(a, a + len, acc);
      std::copy(acc, acc + len, dst + base);
      continue;
    }
    if (k_terms == 2) {
      const T* a = term(0, base);
      const T* b = term(1, base);
      for (std::int64_t i = 0; i < len; ++i) acc[i] = combine(a[i], b[i]);
      std::copy(acc, acc + len, dst + base);
      continue;
    }
    {
      const T* a = term(0, base);
      const T* b = term(1, base);
      for (std::int64_t i = 0; i < len; ++i) acc[i] = combine(a[i], b[i]);
    }
    for (std::size_t k = 2; k + 1 < k_terms; ++k) {
      const T* t = term(k, base);
      for (std::int64_t i = 0; i < len; ++i) acc[i] = combine(acc[i], t[i]);
    }
    // The last term may alias `out` at this tile: every read of it happens before the write of
    // the same element.
    const T* last = term(k_terms - 1, base);
    T* o = dst + base;
    for (std::int64_t i = 0; i < len; ++i) o[i] = combine(acc[i], last[i]);
  }
}

// The same loops compiled for AVX2 (twice the vector width), chosen at run time when the
// processor has it; the baseline build stays portable to any x86-64.
#if defined(__x86_64__) && defined(__GNUC__)
template <typename T, typename Combine>
__attribute__((target("avx2"))) void reduce_typed_avx2(std::span<const std::byte* const> terms,
                                                       std::byte* out, std::int64_t n,
                                                       Combine combine) {
  reduce_typed_body<T>(terms, out, n, combine);
}
#endif

template <typename T, typename Combine>
void reduce_typed(std::span<const std::byte* const> terms, std::byte* out, std::int64_t n,
                  Combine combine) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return reduce_typed_avx2<T>(terms, out, n, combine);
#endif
  reduce_typed_body<T>(terms, out, n, combine);
}

}  // namespace

void reduce_terms(ReduceOp op, DType dtype, std::span<const std::byte* const> terms, std::byte* out,
                  std::int64_t n) {
  MESHFLOW_CHECK(!terms.empty());
  if (n <= 0) return;
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        reduce_typed<T>(terms, out, n, [](T a, T b) { return static_cast<T>(a + b); });
        break;
      case ReduceOp::kMax:
        reduce_typed<T>(terms, out, n, [](T a, T b) { return b > a ? b : a; });
        break;
      case ReduceOp::kMin:
        reduce_typed<T>(terms, out, n, [](T a, T b) { return b < a ? b : a; });
        break;
    }
  });
  if (op == ReduceOp::kAvg) divide_by(dtype, out, n, static_cast<std::int64_t>(terms.size()));
}

void divide_by(DType dtype, std::byte* data, std::int64_t n, std::int64_t divisor) {
  if (divisor == 1) return;
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = reinterpret_cast<T*>(data);
    const T d = static_cast<T>(divisor);
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
  });
}

std::optional<FlatReduction> flat_reduction(std::span<const ReduceOp> ops,
                                            std::span<const std::int64_t> sizes) {
  MESHFLOW_CHECK(ops.size() == sizes.size());
  bool all_sum_avg = true, all_same = true;
  std::int64_t avg_divisor = 1;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    all_sum_avg = all_sum_avg && (ops[i] == ReduceOp::kSum || ops[i] == ReduceOp::kAvg);
    all_same = all_same && ops[i] == ops[0];
    if (ops[i] == ReduceOp::kAvg) avg_divisor *= sizes[i];
  }
  if (all_sum_avg) return FlatReduction{ReduceOp::kSum, avg_divisor};
  if (all_same) return FlatReduction{ops[0], 1};
  return std::nullopt;
}

void reduce_partial_terms(std::span<const ReduceOp> ops, std::span<const std::int64_t> sizes,
                          DType dtype, std::span<const std::byte* const> terms, std::byte* out,
                          std::int64_t n) {
  MESHFLOW_CHECK(!terms.empty());
  if (auto flat = flat_reduction(ops, sizes)) {
    reduce_terms(flat->op, dtype, terms, out, n);
    divide_by(dtype, out, n, flat->divisor);
    return;
  }
  // Mixed ops: value = op_0(op_1(...)): reduce each block of terms sharing the outer
  // coordinates over the innermost dim, then recurse on the outer dims.
  const std::int64_t inner = sizes.back();
  const std::size_t es = size_of(dtype);
  std::vector<std::vector<std::byte>> partial(
      terms.size() / inner, std::vector<std::byte>(static_cast<std::size_t>(n) * es + 1));
  std::vector<const std::byte*> next;
  for (std::size_t g = 0; g < partial.size(); ++g) {
    reduce_partial_terms(ops.last(1), sizes.last(1), dtype,
                         terms.subspan(g * static_cast<std::size_t>(inner), inner),
                         partial[g].data(), n);
    next.push_back(partial[g].data());
  }
  reduce_partial_terms(ops.first(ops.size() - 1), sizes.first(sizes.size() - 1), dtype, next, out,
                       n);
}

}  // namespace meshflow
