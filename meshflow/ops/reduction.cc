#include "meshflow/ops/reduction.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"

namespace meshflow {

bool is_reduction_family(OpType t) {
  return t == OpType::kSum || t == OpType::kMean || t == OpType::kSumTo ||
         t == OpType::kBroadcastTo;
}

std::vector<int> sum_to_dims(const Shape& from, const Shape& to) {
  if (to.size() > from.size()) {
    fail(ErrorKind::kShapeMismatch, "sum_to: {} has fewer dims than target {}", to_string(from),
         to_string(to));
  }
  const std::size_t extra = from.size() - to.size();
  std::vector<int> dims;
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (i < extra) {
      dims.push_back(static_cast<int>(i));
      continue;
    }
    const std::int64_t t = to[i - extra];
    if (t == from[i]) continue;
    if (t != 1) {
      fail(ErrorKind::kShapeMismatch, "sum_to: {} does not broadcast from {}", to_string(from),
           to_string(to));
    }
    dims.push_back(static_cast<int>(i));
  }
  return dims;
}

namespace {

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// out[map(i)] += in[i] over every element of `in`, where input dim d goes to output stride
// out_strides[d] (0 for a summed dim). Writes every element of `out`, uninitialised on entry.
template <typename T>
void sum_into(const Tensor& in, const std::vector<std::int64_t>& out_strides, Tensor& out) {
  const Shape& shape = in.shape();
  const std::int64_t n = in.numel();
  T* po = reinterpret_cast<T*>(out.bytes());
  if (n == 0) {
    std::fill(po, po + out.numel(), T(0));
    return;
  }
  const T* pi = reinterpret_cast<const T*>(in.bytes());
  if (shape.empty()) {
    po[0] = pi[0];
    return;
  }
  const std::size_t rank = shape.size();
  // Leading dims summed, the trailing ones kept whole in order: rows added into one (vectorised,
  // split over the device's threads).
  std::size_t kept = rank;
  while (kept > 0 && out_strides[kept - 1] != 0) --kept;
  bool rows_summed = kept > 0 && kept < rank;
  for (std::size_t d = 0; d < kept; ++d) rows_summed = rows_summed && out_strides[d] == 0;
  std::int64_t cols = 1;
  for (std::size_t d = rank; d-- > kept;) {
    rows_summed = rows_summed && out_strides[d] == cols;
    cols *= shape[d];
  }
  if (rows_summed && cols == out.numel()) {
    if constexpr (sizeof(T) == 4 || sizeof(T) == 8) {
      sum_rows<T>(pi, n / cols, cols, po);  // writes every element: no zeroing pass first
      return;
    }
  }
  std::fill(po, po + out.numel(), T(0));
  const std::int64_t inner = shape[rank - 1];
  const std::int64_t inner_stride = out_strides[rank - 1];
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t o = 0;
  for (std::int64_t row = 0; row < n / inner; ++row) {
    const T* x = pi + row * inner;
    if (inner_stride == 0) {
      T acc = 0;
      for (std::int64_t i = 0; i < inner; ++i) acc += x[i];
      po[o] += acc;
    } else {
      T* y = po + o;
      for (std::int64_t i = 0; i < inner; ++i) y[i] += x[i];
    }
    for (std::size_t d = rank - 1; d-- > 0;) {
      o += out_strides[d];
      if (++index[d] < shape[d]) break;
      o -= out_strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

// Output strides over the input's dims (0 for a summed dim). The output's dims are the
// input's last out_shape.size() dims, summed ones kept as 1 (sum_to), or else the input's
// unsummed dims in order (sum, mean).
std::vector<std::int64_t> strides_over_input(std::size_t in_rank, const std::vector<int>& summed,
                                             const Shape& out_shape, bool keeps_dims) {
  const std::vector<std::int64_t> os = row_major_strides(out_shape);
  std::vector<std::int64_t> st(in_rank, 0);
  const std::size_t extra = in_rank - out_shape.size();
  for (std::size_t d = 0, o = 0; d < in_rank; ++d) {
    const bool dropped = contains(summed, static_cast<int>(d));
    if (keeps_dims) {
      if (d >= extra) st[d] = dropped ? 0 : os[d - extra];
    } else if (!dropped) {
      st[d] = os[o++];
    }
  }
  return st;
}

template <typename T>
void broadcast_from(const Tensor& g, const std::vector<int>& inserted, double scale, Tensor& out) {
  const Shape& shape = out.shape();
  const std::int64_t n = out.numel();
  if (n == 0) return;
  T* po = reinterpret_cast<T*>(out.bytes());
  const T* pg = reinterpret_cast<const T*>(g.bytes());
  const T s = static_cast<T>(scale);
  if (shape.empty()) {
    po[0] = pg[0] * s;
    return;
  }
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> gs(rank, 0);
  const std::vector<std::int64_t> g_strides = row_major_strides(g.shape());
  for (std::size_t d = 0, k = 0; d < rank; ++d)
    gs[d] = contains(inserted, static_cast<int>(d)) ? 0 : g_strides[k++];
  const std::int64_t inner = shape[rank - 1], step = gs[rank - 1];
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t o = 0;
  for (std::int64_t row = 0; row < n / inner; ++row) {
    T* y = po + row * inner;
    if (step == 0) {
      const T v = pg[o] * s;
      for (std::int64_t i = 0; i < inner; ++i) y[i] = v;
    } else {
      const T* x = pg + o;
      for (std::int64_t i = 0; i < inner; ++i) y[i] = x[i] * s;
    }
    for (std::size_t d = rank - 1; d-- > 0;) {
      o += gs[d];
      if (++index[d] < shape[d]) break;
      o -= gs[d] * shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace

TensorSpec infer_reduction(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  const TensorSpec& x = in[0];
  const bool integers_ok = op.type != OpType::kMean;
  if (!is_floating(x.dtype) && !integers_ok) {
    fail(ErrorKind::kInvalidArgument, "{}: operand is {}; {} takes float32 or float64", name,
         to_string(x.dtype), name);
  }
  switch (op.type) {
    case OpType::kSum:
    case OpType::kMean: {
      Shape out;
      for (std::size_t d = 0; d < x.shape.size(); ++d)
        if (!contains(op.dims, static_cast<int>(d))) out.push_back(x.shape[d]);
      return {out, x.dtype};
    }
    case OpType::kSumTo:
      sum_to_dims(x.shape, op.shape);
      return {op.shape, x.dtype};
    case OpType::kBroadcastTo: {
      if (x.shape.size() + op.dims.size() != op.shape.size())
        fail(ErrorKind::kShapeMismatch, "broadcast_to: {} with dims {} inserted is not {}",
             to_string(x.shape), op.dims.size(), to_string(op.shape));
      for (std::size_t d = 0, k = 0; d < op.shape.size(); ++d) {
        if (contains(op.dims, static_cast<int>(d))) continue;
        if (op.shape[d] != x.shape[k++])
          fail(ErrorKind::kShapeMismatch, "broadcast_to: {} does not fit {} at dim {}",
               to_string(x.shape), to_string(op.shape), d);
      }
      return {op.shape, x.dtype};
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a reduction", name);
  }
}

Tensor reduction_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const std::vector<TensorSpec>& globals) {
  const Tensor& x = *in[0];
  Tensor out;
  if (op.type == OpType::kBroadcastTo) {
    // The local result: the operand's local dims, with the inserted dims at their full size.
    Shape shape(op.shape.size());
    for (std::size_t d = 0, k = 0; d < shape.size(); ++d)
      shape[d] = contains(op.dims, static_cast<int>(d)) ? op.shape[d] : x.shape()[k++];
    out = Tensor::uninitialized(x.dtype(), shape);
    visit_dtype(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      broadcast_from<T>(x, op.dims, op.scale, out);
    });
    return out;
  }
  std::vector<int> summed = op.dims;
  Shape shape;
  if (op.type == OpType::kSumTo) {
    // Local: the dims sum_to removes globally (a shard of a kept dim stays as it is).
    summed = sum_to_dims(globals[0].shape, op.shape);
    const std::size_t extra = x.shape().size() - op.shape.size();
    for (std::size_t d = extra; d < x.shape().size(); ++d)
      shape.push_back(contains(summed, static_cast<int>(d)) ? 1 : x.shape()[d]);
  } else {
    for (std::size_t d = 0; d < x.shape().size(); ++d)
      if (!contains(summed, static_cast<int>(d))) shape.push_back(x.shape()[d]);
  }
  out = Tensor::uninitialized(x.dtype(), shape);
  const auto strides =
      strides_over_input(x.shape().size(), summed, shape, op.type == OpType::kSumTo);
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      sum_into<T>(x, strides, out);
      if (op.type == OpType::kMean) {
        std::int64_t count = 1;
        for (int d : summed) count *= globals[0].shape[static_cast<std::size_t>(d)];
        T* p = reinterpret_cast<T*>(out.bytes());
        const T c = static_cast<T>(count);
        for (std::int64_t i = 0; i < out.numel(); ++i) p[i] /= c;
      }
    } else {
      // Integer sums wrap around as NumPy's do: summed as the unsigned type of the same
      // width, whose overflow is defined and whose bits are the same two's-complement sum.
      sum_into<std::make_unsigned_t<T>>(x, strides, out);
    }
  });
  return out;
}

DimLabels reduction_labels(const Op& op, const std::vector<TensorSpec>& in, const Shape& out) {
  DimLabels l;
  const int r = static_cast<int>(out.size());
  switch (op.type) {
    case OpType::kSum:
    case OpType::kMean: {
      l.inputs = {label_range(0, static_cast<int>(in[0].shape.size()))};
      for (int d = 0; d < static_cast<int>(in[0].shape.size()); ++d)
        if (!contains(op.dims, d)) l.output.push_back(d);
      l.terms = {0};
      return l;
    }
    case OpType::kSumTo: {
      const int rg = static_cast<int>(in[0].shape.size());
      const int extra = rg - r;
      l.inputs = {label_range(0, rg)};
      for (int j = 0; j < r; ++j) {
        const bool collapsed = out[j] == 1 && in[0].shape[j + extra] != 1;
        l.output.push_back(collapsed ? rg + j : j + extra);
      }
      l.terms = {0};
      return l;
    }
    case OpType::kBroadcastTo: {
      l.output = label_range(0, r);
      std::vector<int> g;
      for (int d = 0; d < r; ++d)
        if (!contains(op.dims, d)) g.push_back(d);
      l.inputs = {g};
      l.terms = {0};
      return l;
    }
    default:
      MESHFLOW_CHECK(false, "{} is not a reduction", to_string(op.type));
  }
}

}  // namespace meshflow
