#include "meshflow/ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {

bool is_embedding_family(OpType t) {
  return t == OpType::kEmbedding || t == OpType::kEmbeddingGrad;
}

TensorSpec infer_embedding(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  const TensorSpec& ids = in[0];
  if (ids.dtype != DType::kInt32 && ids.dtype != DType::kInt64) {
    fail(ErrorKind::kInvalidArgument, "{}: ids are {}; they must be int32 or int64", name,
         to_string(ids.dtype));
  }
  const TensorSpec& rows = in[1];  // the table, or the gradient
  if (!is_floating(rows.dtype)) {
    fail(ErrorKind::kInvalidArgument, "{}: operand 1 is {}; {} takes float32 or float64", name,
         to_string(rows.dtype), name);
  }
  if (op.type == OpType::kEmbedding) {
    if (rows.shape.size() != 2) {
      fail(ErrorKind::kShapeMismatch, "{}: the table is {}; it must be [V, D]", name,
           to_string(rows.shape));
    }
    Shape out = ids.shape;
    out.push_back(rows.shape[1]);
    return {out, rows.dtype};
  }
  Shape want = ids.shape;
  want.push_back(op.shape.size() == 2 ? op.shape[1] : -1);
  if (op.shape.size() != 2 || rows.shape != want) {
    fail(ErrorKind::kShapeMismatch, "{}: gradient {} does not fit ids {} and a table of {}", name,
         to_string(rows.shape), to_string(ids.shape), to_string(op.shape));
  }
  return {op.shape, rows.dtype};
}

namespace {

template <typename I>
std::int64_t id_at(const Tensor& ids, std::int64_t i) {
  return static_cast<std::int64_t>(ids.data<I>()[static_cast<std::size_t>(i)]);
}

template <typename T, typename I>
Tensor run(const Op& op, const Tensor& ids, const Tensor& rows, std::int64_t vocab,
           std::int64_t first_row) {
  const std::int64_t d = rows.shape().back(), n = ids.numel();
  auto checked = [&](std::int64_t i) {
    const std::int64_t id = id_at<I>(ids, i);
    if (id < 0 || id >= vocab) {
      fail(ErrorKind::kInvalidArgument, "{}: id {} is out of range for a table of {} rows",
           to_string(op.type), id, vocab);
    }
    return id;
  };
  if (op.type == OpType::kEmbedding) {
    // rows: this device's table rows [first_row, first_row + local rows)
    const std::int64_t local_rows = rows.shape()[0];
    Shape out = ids.shape();
    out.push_back(d);
    Tensor y = Tensor::uninitialized(rows.dtype(), out);
    const T* t = rows.data<T>().data();
    T* py = y.data<T>().data();
    // Tokens split over the device's threads; zeros where another device owns the row.
    parallel_for(n, row_grain(d), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t i = first; i < last; ++i) {
        const std::int64_t r = checked(i) - first_row;
        if (r >= 0 && r < local_rows) {
          std::memcpy(py + i * d, t + r * d, sizeof(T) * static_cast<std::size_t>(d));
        } else {
          std::fill(py + i * d, py + (i + 1) * d, T(0));
        }
      }
    });
    return y;
  }
  // first[v]: the first token whose id is v, or -1 where no token has it.
  std::vector<std::int64_t> first(static_cast<std::size_t>(vocab), -1);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t& f = first[static_cast<std::size_t>(checked(i))];
    if (f < 0) f = i;
  }
  Tensor grad = Tensor::uninitialized(rows.dtype(), {vocab, d});
  const T* g = rows.data<T>().data();
  T* pg = grad.data<T>().data();
  // The table zeroed, each thread its block of rows in one memset; then a row some token names
  // gets its first token's gradient copied, and each later token's added in token order (the
  // sum 0 + g1 + g2 ... would give). Rows split over the device's threads, then the columns for
  // the additions (a repeated id adds in order alone). One memset of the block, whose bulk
  // stores write whole lines without reading them, then copies over the named rows: 0.35 ms
  // for the bench GPT's [8192, 512] table on one thread, against 0.66-0.70 ms when each row
  // was either zeroed or copied (`meshflow bench kernels --cases embedding_bwd --threads 1`).
  parallel_for(vocab, row_grain(d), [&](std::int64_t begin, std::int64_t end) {
    std::memset(pg + begin * d, 0, sizeof(T) * static_cast<std::size_t>((end - begin) * d));
    for (std::int64_t v = begin; v < end; ++v) {
      const std::int64_t f = first[static_cast<std::size_t>(v)];
      if (f >= 0) std::memcpy(pg + v * d, g + f * d, sizeof(T) * static_cast<std::size_t>(d));
    }
  });
  parallel_for(d, column_grain(n), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t id = id_at<I>(ids, i);
      if (first[static_cast<std::size_t>(id)] == i) continue;
      T* __restrict dst = pg + id * d;
      const T* __restrict src = g + i * d;
      if constexpr (std::is_same_v<T, float>) {
        add_to(dst + begin, src + begin, end - begin);
      } else {
        for (std::int64_t j = begin; j < end; ++j) dst[j] += src[j];
      }
    }
  });
  return grad;
}

}  // namespace

Tensor embedding_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const std::vector<TensorSpec>& globals, const ShardOffsets& offsets) {
  const bool forward = op.type == OpType::kEmbedding;
  const std::int64_t vocab = forward ? globals[1].shape[0] : op.shape[0];
  const std::int64_t first_row = forward && offsets.size() > 1 ? offsets[1][0] : 0;
  return visit_dtype(in[0]->dtype(), [&](auto id) -> Tensor {
    using I = decltype(id);
    if constexpr (std::is_integral_v<I>) {
      return in[1]->dtype() == DType::kFloat64
                 ? run<double, I>(op, *in[0], *in[1], vocab, first_row)
                 : run<float, I>(op, *in[0], *in[1], vocab, first_row);
    } else {
      MESHFLOW_CHECK(false, "{} with {} ids", to_string(op.type), to_string(in[0]->dtype()));
    }
  });
}

DimLabels embedding_labels(const Op& op, const std::vector<TensorSpec>& in) {
  const int k = static_cast<int>(in[0].shape.size());
  const std::vector<int> ids = label_range(0, k);
  const int v = k, d = k + 1;  // the vocabulary and the embedding width
  std::vector<int> with_d = ids;
  with_d.push_back(d);
  DimLabels l;
  l.factors = {1};  // linear in the table (forward) or the gradient
  if (op.type == OpType::kEmbedding) {
    l.inputs = {ids, {v, d}};
    l.output = with_d;  // v is summed away: a vocabulary shard gives a Partial(sum) term
  } else {
    l.inputs = {ids, with_d};
    l.output = {v, d};  // v is the result's alone, so never sharded
  }
  return l;
}

}  // namespace meshflow
