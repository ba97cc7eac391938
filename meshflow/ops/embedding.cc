#include "meshflow/ops/embedding.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
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
  Tensor grad = Tensor::uninitialized(rows.dtype(), {vocab, d});
  const T* g = rows.data<T>().data();
  T* pg = grad.data<T>().data();
  const auto row_bytes = sizeof(T) * static_cast<std::size_t>(d);
  // The table's rows split over the device's threads, each part linking its own rows' tokens:
  // first[v], the first token whose id is v, or -1 where no token has it (each part its rows'
  // entries); and in part p's own array next[i], the next token after i with i's id, or -1 (for
  // the tokens of p's rows). With one thread linking every token, the other read next[] at
  // random from lines the first had written, each read a miss to the other core. The bench
  // GPT's gradient on two threads, both kernels alternated in one process: 121-130 us against
  // 131-144 where the floor ran from cache (85-88 us), 4-6 us slower (171-194 against 166-190)
  // where it did not, where each part's scan of every id costs more than it saves.
  // One allocation: with a vector each for these and for a scan's last token of each id, glibc
  // trimmed the heap's top as they were freed, and every call faulted their pages in afresh
  // (about 40 us).
  const int parts = parallel_parts(vocab, row_grain(d));
  const auto links =
      std::make_unique_for_overwrite<std::int64_t[]>(static_cast<std::size_t>(vocab + parts * n));
  std::int64_t* first = links.get();
  const auto next_of = [&](int part) { return first + vocab + part * n; };
  // Adds the gradients of the tokens after i (row v's first) to row v's columns [begin, end).
  const auto add_later = [&](const std::int64_t* next, std::int64_t v, std::int64_t i,
                             std::int64_t begin, std::int64_t end) {
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
  const auto later_tokens = [&](const std::int64_t* next, std::int64_t i) {
    std::int64_t k = 0;
    for (i = next[i]; i >= 0 && k <= kInlineAdds; i = next[i]) ++k;
    return k;
  };
  std::atomic<bool> bad_ids = false;  // some part saw an id out of range
  // Each part's rows with more than kInlineAdds later tokens, for the second pass.
  std::vector<std::vector<std::int64_t>> frequent(static_cast<std::size_t>(parts));
  // Each part its rows of the table, kZeroBlockBytes at a time: the block zeroed by one memset
  // (whose bulk stores write whole lines without reading them: a memset or a copy per row took
  // twice as long), then, while the block is in cache, each row some token names gets its first
  // token's gradient copied over and each later token's added in token order (the sum
  // 0 + g1 + g2 ... would give), the next named row's first gradient and link prefetched
  // meanwhile. `meshflow bench kernels` (the bench GPT's [8192, 512] table on two threads): the
  // zeroing, the copies and the additions took 40-80 us each as three passes over the whole
  // table, whose lines had left the cache by the next pass; this took 155-168 us against their
  // 199-214, both kernels alternated as cases in one process.
  const auto block = std::max<std::int64_t>(
      1, kZeroBlockBytes / static_cast<std::int64_t>(std::max<std::size_t>(1, row_bytes)));
  parallel_parts_for(vocab, parts, [&](int part, std::int64_t begin, std::int64_t end) {
    std::int64_t* next = next_of(part);
    std::fill(first + begin, first + end, -1);
    // Every token is linked, another part's (or an id out of range) through a slot of its own
    // (`other`), without a branch: half the tokens are another part's, at random, and a branch
    // mispredicted on them. An id out of range is named after the parts, by the check below.
    std::int64_t other = -1;
    bool out_of_range = false;
    for (std::int64_t i = n - 1; i >= 0; --i) {
      const auto v = static_cast<std::int64_t>(id_of[i]);
      std::int64_t* slot = v >= begin && v < end ? first + v : &other;
      next[i] = *slot;
      *slot = i;
      out_of_range |= v < 0 || v >= vocab;
    }
    if (out_of_range) bad_ids = true;
    const auto next_named = [&](std::int64_t v) {
      while (v < end && first[v] < 0) ++v;
      return v;
    };
    const auto prefetch = [&](std::int64_t v) {
      if (v == end) return;
      const auto* src = reinterpret_cast<const char*>(g + first[v] * d);
      // A line at a time (kTensorAlignment is one).
      for (std::size_t b = 0; b < row_bytes; b += kTensorAlignment) __builtin_prefetch(src + b);
      __builtin_prefetch(next + first[v]);
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
        if (later_tokens(next, i) > kInlineAdds) {
          frequent[static_cast<std::size_t>(part)].push_back(v);
        } else {
          add_later(next, v, i, 0, d);
        }
        v = after;
      }
    }
  });
  if (bad_ids) {
    for (std::int64_t i = 0; i < n; ++i) checked(i);  // the first id out of range fails
  }
  // A frequent token's row, its later tokens' gradients added with the columns split over the
  // threads: rows split would leave most of a skewed batch's additions to one thread.
  if (std::any_of(frequent.begin(), frequent.end(), [](const auto& f) { return !f.empty(); })) {
    parallel_for(d, column_grain(n), [&](std::int64_t begin, std::int64_t end) {
      for (int p = 0; p < parts; ++p) {
        for (const std::int64_t v : frequent[static_cast<std::size_t>(p)])
          add_later(next_of(p), v, first[v], begin, end);
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
