#include "meshflow/ops/embedding.h"

#include <algorithm>
#include <atomic>
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

// The embedding gradient's table is zeroed this many bytes at a time, and a row's later tokens
// are added with the row split over threads where there are more than kInlineAdds (see run).
constexpr std::int64_t kZeroBlockBytes = std::int64_t{64} << 10;
constexpr std::int64_t kInlineAdds = 8;

template <typename T, typename I>
Tensor run(const Op& op, const Tensor& ids, const Tensor& rows, std::int64_t vocab,
           std::int64_t first_row) {
  const std::int64_t d = rows.shape().back(), n = ids.numel();
  const I* id_of = ids.data<I>().data();  // once: data() checks the dtype on every call
  auto checked = [&](std::int64_t i) {
    const auto id = static_cast<std::int64_t>(id_of[i]);
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
  for (std::int64_t i = 0; i < n; ++i) checked(i);  // the first id out of range fails
  // first[v]: the first token whose id is v, or -1 where no token has it; next[i]: the next
  // token after i with i's id, or -1. One allocation: with a vector each for these and for a
  // scan's last token of each id, glibc trimmed the heap's top as they were freed, and every
  // call faulted their pages in afresh (about 40 us of the bench GPT's gradient).
  std::vector<std::int64_t> links(static_cast<std::size_t>(vocab + n), -1);
  std::int64_t* first = links.data();
  std::int64_t* next = first + vocab;
  for (std::int64_t i = n - 1; i >= 0; --i) {
    std::int64_t& f = first[id_of[i]];
    next[i] = f;
    f = i;
  }
  Tensor grad = Tensor::uninitialized(rows.dtype(), {vocab, d});
  const T* g = rows.data<T>().data();
  T* pg = grad.data<T>().data();
  const auto row_bytes = sizeof(T) * static_cast<std::size_t>(d);
  // Adds the gradients of the tokens after i (row v's first) to row v's columns [begin, end).
  const auto add_later = [&](std::int64_t v, std::int64_t i, std::int64_t begin, std::int64_t end) {
    T* __restrict dst = pg + v * d + begin;
    for (i = next[i]; i >= 0; i = next[i]) {
      const T* __restrict src = g + i * d + begin;
      if constexpr (std::is_same_v<T, float>) {
        add_to(dst, src, end - begin);
      } else {
        for (std::int64_t j = 0; j < end - begin; ++j) dst[j] += src[j];
      }
    }
  };
  // Returns how many tokens after i have i's id, counting to kInlineAdds + 1 at most.
  const auto later_tokens = [&](std::int64_t i) {
    std::int64_t k = 0;
    for (i = next[i]; i >= 0 && k <= kInlineAdds; i = next[i]) ++k;
    return k;
  };
  std::atomic<bool> frequent = false;  // some row has more than kInlineAdds later tokens
  // Each thread its rows of the table, kZeroBlockBytes at a time: the block zeroed by one memset
  // (whose bulk stores write whole lines without reading them: a memset or a copy per row took
  // twice as long), then, while the block is in cache, each row some token names gets its first
  // token's gradient copied over and each later token's added in token order (the sum
  // 0 + g1 + g2 ... would give), the next named row's first gradient prefetched meanwhile.
  // `meshflow bench kernels` (the bench GPT's [8192, 512] table on two threads): the zeroing,
  // the copies and the additions took 40-80 us each as three passes over the whole table, whose
  // lines had left the cache by the next pass; this took 155-168 us against their 199-214,
  // both kernels alternated as cases in one process.
  const auto block = std::max<std::int64_t>(
      1, kZeroBlockBytes / static_cast<std::int64_t>(std::max<std::size_t>(1, row_bytes)));
  parallel_for(vocab, row_grain(d), [&](std::int64_t begin, std::int64_t end) {
    const auto next_named = [&](std::int64_t v) {
      while (v < end && first[v] < 0) ++v;
      return v;
    };
    const auto prefetch = [&](std::int64_t v) {
      if (v == end) return;
      const auto* src = reinterpret_cast<const char*>(g + first[v] * d);
      // A line at a time (kTensorAlignment is one).
      for (std::size_t b = 0; b < row_bytes; b += kTensorAlignment) __builtin_prefetch(src + b);
    };
    std::int64_t v = next_named(begin);
    prefetch(v);
    for (std::int64_t b0 = begin; b0 < end; b0 += block) {
      const std::int64_t b1 = std::min(end, b0 + block);
      std::memset(pg + b0 * d, 0, row_bytes * static_cast<std::size_t>(b1 - b0));
      while (v < b1) {
        const std::int64_t after = next_named(v + 1);
        prefetch(after);
        const std::int64_t i = first[v];
        std::memcpy(pg + v * d, g + i * d, row_bytes);
        if (later_tokens(i) > kInlineAdds) {
          first[v] = -2 - i;  // marks the row for the second pass
          frequent = true;
        } else {
          add_later(v, i, 0, d);
        }
        v = after;
      }
    }
  });
  // A frequent token's row, its later tokens' gradients added with the columns split over the
  // threads: rows split would leave most of a skewed batch's additions to one thread.
  if (frequent) {
    parallel_for(d, column_grain(n), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t v = 0; v < vocab; ++v) {
        if (first[v] <= -2) add_later(v, -2 - first[v], begin, end);
      }
    });
  }
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
