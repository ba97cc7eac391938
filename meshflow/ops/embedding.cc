#include "meshflow/ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"
#include "meshflow/kernels/copy_rows.h"
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
    // Tokens split over the device's threads; zeros where another device owns the row. Each row
    // moves in whole registers (kernels/copy_rows.h): 46-48 us for the bench GPT's 2,048 rows
    // of 2 KiB on two threads against 48-50 through memcpy, and prefetching the next one, two or
    // four tokens' rows took 50-55 (interleaved rep by rep in one bench process).
    const auto row_bytes = static_cast<std::int64_t>(sizeof(T)) * d;
    parallel_for(n, row_grain(d), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t i = first; i < last; ++i) {
        const std::int64_t r = checked(i) - first_row;
        if (r >= 0 && r < local_rows) {
          copy_rows(reinterpret_cast<const std::byte*>(t + r * d), row_bytes,
                    reinterpret_cast<std::byte*>(py + i * d), 1, row_bytes);
        } else {
          std::fill(py + i * d, py + (i + 1) * d, T(0));
        }
      }
    });
    return y;
  }
  // first[v]: the first token whose id is v, or -1 where no token has it; later[i]: the next
  // token after i with i's id, or -1 (last[v] is the latest token seen with id v); count[v]: the
  // tokens whose id is v.
  std::vector<std::int64_t> first(static_cast<std::size_t>(vocab), -1), last(first.size(), -1);
  std::vector<std::int64_t> later(static_cast<std::size_t>(n), -1), count(first.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::size_t>(checked(i));
    std::int64_t& f = first[id];
    if (f < 0) {
      f = i;
    } else {
      later[static_cast<std::size_t>(last[id])] = i;
    }
    last[id] = i;
    ++count[id];
  }
  // The rows split over the device's threads by work, not by number: a row costs its zeroing
  // and a copy or an add per token that names it. A text's frequent tokens often have
  // neighbouring ids (a BPE vocabulary numbers its first merges first), and an equal split of
  // the rows would leave their additions to one thread. At the bench GPT's size the split costs
  // nothing measurable, and with 60% of the tokens on 300 ids neither split was faster (the
  // table's zeroing dominates); more tokens per step than rows would tip it.
  const int parts = parallel_parts(vocab, row_grain(d));
  std::vector<std::int64_t> bounds(static_cast<std::size_t>(parts) + 1, vocab);
  bounds[0] = 0;
  const std::int64_t total = vocab + n;
  std::int64_t work = 0;
  for (std::int64_t v = 0, p = 1; v < vocab && p < parts; ++v) {
    work += 1 + count[static_cast<std::size_t>(v)];
    for (; p < parts && work * parts >= p * total; ++p) bounds[static_cast<std::size_t>(p)] = v + 1;
  }
  Tensor grad = Tensor::uninitialized(rows.dtype(), {vocab, d});
  const T* g = rows.data<T>().data();
  T* pg = grad.data<T>().data();
  // The table zeroed a chunk of rows at a time, each thread its block of rows; then a row some
  // token names gets its first token's gradient copied, and each later token's added in token
  // order (the sum 0 + g1 + g2 ... would give), while the chunk is in cache; each row's tokens
  // added by the thread that owns it.
  //
  // Measured on the bench GPT's [8192, 512] table from 2,048 tokens on two threads, the variants
  // interleaved rep by rep in one `meshflow bench kernels` process, each rep followed by a
  // 10 MiB memcpy (the floor): one memset of each thread's whole block (bulk stores that write
  // lines without reading them), then the copies, 339-370 us; a memset per chunk of 256 KiB,
  // each followed by its rows, 280-307 us (chunks of 64 KiB: 291-318; of 1 MiB: 298-325). In a
  // harness likewise interleaved, each row zeroed or copied alone took 1.6-2.0x the floor with
  // vector stores or a memset per run of unnamed rows, and 1.3-1.8x with streaming stores; a
  // second pass that split the columns for the repeated ids, each thread reading every token's
  // id, 10-15% longer than adding them here.
  constexpr std::size_t kZeroChunkBytes = std::size_t{256} << 10;
  const auto row_bytes = sizeof(T) * static_cast<std::size_t>(d);
  const auto chunk =
      row_bytes == 0
          ? std::max<std::int64_t>(vocab, 1)  // rows of width 0
          : static_cast<std::int64_t>(std::max<std::size_t>(1, kZeroChunkBytes / row_bytes));
  parallel_parts_for(parts, parts, [&](int part, std::int64_t, std::int64_t) {
    const std::int64_t begin = bounds[static_cast<std::size_t>(part)];
    const std::int64_t end = bounds[static_cast<std::size_t>(part) + 1];
    for (std::int64_t c = begin; c < end; c += chunk) {
      const std::int64_t c_end = std::min(end, c + chunk);
      std::memset(pg + c * d, 0, row_bytes * static_cast<std::size_t>(c_end - c));
      for (std::int64_t v = c; v < c_end; ++v) {
        const std::int64_t f = first[static_cast<std::size_t>(v)];
        if (f < 0) continue;
        T* __restrict dst = pg + v * d;
        std::memcpy(dst, g + f * d, row_bytes);
        for (std::int64_t i = later[static_cast<std::size_t>(f)]; i >= 0;
             i = later[static_cast<std::size_t>(i)]) {
          const T* __restrict src = g + i * d;
          if constexpr (std::is_same_v<T, float>) {
            add_to(dst, src, d);
          } else {
            for (std::int64_t j = 0; j < d; ++j) dst[j] += src[j];
          }
        }
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
