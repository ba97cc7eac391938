#include "meshflow/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/scratch.h"
#include "meshflow/kernels/softmax.h"
#include "meshflow/ops/matmul.h"

namespace meshflow {

bool is_attention_family(OpType t) {
  return t == OpType::kAttention || t == OpType::kAttentionGradQ || t == OpType::kAttentionGradK ||
         t == OpType::kAttentionGradV;
}

namespace {

// Query rows per block: the scores of a block are kBlockRows x Sk.
constexpr std::int64_t kBlockRows = 64;

struct Dims {
  std::int64_t batch = 1, sq = 0, sk = 0, dk = 0, dv = 0;
};

Dims dims_of(const Shape& q, const Shape& k, const Shape& v) {
  Dims d;
  for (std::size_t i = 0; i + 2 < q.size(); ++i) d.batch *= q[i];
  d.sq = q[q.size() - 2];
  d.dk = q.back();
  d.sk = k[k.size() - 2];
  d.dv = v.back();
  return d;
}

// The keys a block of `rows` query rows from r0 sees: all, or with a causal mask those up to
// its last query's global position (q_off + r0 + rows), counted from k's first (k_off).
std::int64_t block_keys(const Op& op, const Dims& d, std::int64_t q_off, std::int64_t k_off,
                        std::int64_t r0, std::int64_t rows) {
  return op.causal ? std::clamp<std::int64_t>(q_off + r0 + rows - k_off, 0, d.sk) : d.sk;
}

// The sequence offsets of q's and k's shards (0 where none is given).
std::pair<std::int64_t, std::int64_t> sequence_offsets(std::size_t rank,
                                                       const ShardOffsets& offsets) {
  const std::size_t seq = rank - 2;
  return {offsets.size() > 0 ? offsets[0][seq] : 0, offsets.size() > 1 ? offsets[1][seq] : 0};
}

}  // namespace

TensorSpec infer_attention(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, in, true);
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  auto mismatch = [&](std::string_view what) {
    fail(ErrorKind::kShapeMismatch, "{}: q {}, k {}, v {} {}", name, to_string(q), to_string(k),
         to_string(v), what);
  };
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size())
    mismatch("must have the same rank, at least 2 ([..., S, D])");
  for (std::size_t i = 0; i + 2 < q.size(); ++i)
    if (k[i] != q[i] || v[i] != q[i]) mismatch("disagree in their leading dims");
  if (k.back() != q.back()) mismatch("disagree in Dk (the last dim of q and k)");
  if (v[v.size() - 2] != k[k.size() - 2]) mismatch("disagree in Sk (dim -2 of k and v)");
  Shape out = q;
  out.back() = v.back();
  if (op.type != OpType::kAttention) {
    if (in[3].shape != out) {
      fail(ErrorKind::kShapeMismatch, "{}: gradient {} is not the result's shape {}", name,
           to_string(in[3].shape), to_string(out));
    }
    if (op.type == OpType::kAttentionGradK) return {k, in[0].dtype};
    if (op.type == OpType::kAttentionGradV) return {v, in[0].dtype};
    return {q, in[0].dtype};
  }
  return {out, in[0].dtype};
}

namespace {

// What one pass makes: the forward's result, or any of the three gradients (their operands
// are the same, and they share the probabilities and, for q and k, dS).
struct Wanted {
  bool out = false, q = false, k = false, v = false;
};

Wanted wanted(std::span<const Op> ops) {
  Wanted w;
  for (const Op& op : ops) {
    bool& slot = op.type == OpType::kAttention        ? w.out
                 : op.type == OpType::kAttentionGradQ ? w.q
                 : op.type == OpType::kAttentionGradK ? w.k
                                                      : w.v;
    MESHFLOW_CHECK(!slot, "{} twice in one attention pass", to_string(op.type));
    slot = true;
  }
  MESHFLOW_CHECK(!w.out || ops.size() == 1, "attention's forward runs alone");
  return w;
}

template <typename T>
std::vector<Tensor> run(std::span<const Op> ops, const std::vector<const Tensor*>& in,
                        std::int64_t q_off, std::int64_t k_off) {
  const Tensor &q = *in[0], &k = *in[1], &v = *in[2];
  const Dims d = dims_of(q.shape(), k.shape(), v.shape());
  const T scale =
      static_cast<T>(1 / std::sqrt(static_cast<double>(std::max<std::int64_t>(1, d.dk))));
  const Op& op = ops.front();  // causal is the same for every op of the pass
  const Wanted w = wanted(ops);
  std::vector<Tensor> outs;
  for (const Op& o : ops) {
    Shape shape = o.type == OpType::kAttentionGradK   ? k.shape()
                  : o.type == OpType::kAttentionGradV ? v.shape()
                                                      : q.shape();
    if (o.type == OpType::kAttention) shape.back() = d.dv;
    // Zeros where the blocks add into it (the gradients of k and v) or no block runs; the
    // forward's result and dq have every row written by their block's product (zeros where it
    // sees no key).
    const bool summed = o.type == OpType::kAttentionGradK || o.type == OpType::kAttentionGradV;
    outs.push_back(summed || d.sk == 0 || d.sq == 0 ? Tensor(q.dtype(), shape)
                                                    : Tensor::uninitialized(q.dtype(), shape));
  }
  if (d.sk == 0 || d.sq == 0) return outs;
  auto result = [&](OpType type) -> T* {
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i].type == type) return outs[i].data<T>().data();
    return nullptr;
  };
  T* const o_data = result(OpType::kAttention);
  T* const dq_data = result(OpType::kAttentionGradQ);
  T* const dk_data = result(OpType::kAttentionGradK);
  T* const dv_data = result(OpType::kAttentionGradV);
  const T* g = w.out ? nullptr : in[3]->data<T>().data();
  const bool ds = w.q || w.k;  // dS is needed
  // The leading dims (batch and heads) split over the device's threads, each part with its own
  // block of scores.
  parallel_for(d.batch, 1, [&](std::int64_t first_batch, std::int64_t last_batch) {
    // On a cache line (kernels/scratch.h): 0-2% faster than malloc's alignment, rep by rep.
    ScratchVector<T> p(static_cast<std::size_t>(kBlockRows * d.sk));
    ScratchVector<T> dp(ds ? static_cast<std::size_t>(kBlockRows * d.sk) : 0);
    for (std::int64_t b = first_batch; b < last_batch; ++b) {
      const T* qb = q.data<T>().data() + b * d.sq * d.dk;
      const T* kb = k.data<T>().data() + b * d.sk * d.dk;
      const T* vb = v.data<T>().data() + b * d.sk * d.dv;
      for (std::int64_t r0 = 0; r0 < d.sq; r0 += kBlockRows) {
        const std::int64_t rows = std::min(kBlockRows, d.sq - r0);
        // A causal block sees the keys up to its last query's position: the products and rows
        // below run over those `keys` columns only (the rest of P and dS is 0).
        const std::int64_t keys = block_keys(op, d, q_off, k_off, r0, rows);
        // P = softmax(scale * q kᵀ, masked) for this block of query rows
        gemm<T>(false, true, rows, keys, d.dk, qb + r0 * d.dk, d.dk, kb, d.dk, T(0), p.data(),
                d.sk);
        for (std::int64_t i = 0; i < rows; ++i) {
          T* row = p.data() + i * d.sk;
          // keys after the query's global position are masked when causal
          const std::int64_t last =
              op.causal ? std::clamp<std::int64_t>(q_off + r0 + i - k_off + 1, 0, keys) : keys;
          if constexpr (std::is_same_v<T, float>) {
            softmax_row(row, row, last, keys, scale);
          } else {
            T mx = -std::numeric_limits<T>::infinity();
            for (std::int64_t j = 0; j < last; ++j) mx = std::max(mx, row[j] * scale);
            T sum = 0;
            for (std::int64_t j = 0; j < last; ++j) sum += row[j] = std::exp(row[j] * scale - mx);
            const T inv = sum > 0 ? 1 / sum : 0;
            for (std::int64_t j = 0; j < keys; ++j) row[j] = j < last ? row[j] * inv : 0;
          }
        }
        if (w.out) {  // out = P v
          gemm<T>(false, false, rows, d.dv, keys, p.data(), d.sk, vb, d.dv, T(0),
                  o_data + (b * d.sq + r0) * d.dv, d.dv);
          continue;
        }
        const T* gb = g + (b * d.sq + r0) * d.dv;
        if (w.v) {  // dv += Pᵀ g
          gemm<T>(true, false, keys, d.dv, rows, p.data(), d.sk, gb, d.dv, T(1),
                  dv_data + b * d.sk * d.dv, d.dv);
        }
        if (!ds) continue;
        // dS = P ⊙ (dP − rowsum(dP ⊙ P)) * scale, dP = g vᵀ
        gemm<T>(false, true, rows, keys, d.dv, gb, d.dv, vb, d.dv, T(0), dp.data(), d.sk);
        for (std::int64_t i = 0; i < rows; ++i) {
          T* pr = p.data() + i * d.sk;
          T* dr = dp.data() + i * d.sk;
          if constexpr (std::is_same_v<T, float>) {
            softmax_grad_row(pr, dr, keys, scale);
          } else {
            T dot = 0;
            for (std::int64_t j = 0; j < keys; ++j) dot += pr[j] * dr[j];
            for (std::int64_t j = 0; j < keys; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
          }
        }
        if (w.q) {  // dq = dS k
          gemm<T>(false, false, rows, d.dk, keys, dp.data(), d.sk, kb, d.dk, T(0),
                  dq_data + (b * d.sq + r0) * d.dk, d.dk);
        }
        if (w.k) {  // dk += dSᵀ q
          gemm<T>(true, false, keys, d.dk, rows, dp.data(), d.sk, qb + r0 * d.dk, d.dk, T(1),
                  dk_data + b * d.sk * d.dk, d.dk);
        }
      }
    }
  });
  return outs;
}

}  // namespace

Tensor attention_kernel(const Op& op, const std::vector<const Tensor*>& in,
                        const ShardOffsets& offsets) {
  return std::move(attention_kernels({&op, 1}, in, offsets).front());
}

std::vector<Tensor> attention_kernels(std::span<const Op> ops, const std::vector<const Tensor*>& in,
                                      const ShardOffsets& offsets) {
  MESHFLOW_CHECK(!ops.empty());
  const auto [q_off, k_off] = sequence_offsets(in[0]->shape().size(), offsets);
  return in[0]->dtype() == DType::kFloat64 ? run<double>(ops, in, q_off, k_off)
                                           : run<float>(ops, in, q_off, k_off);
}

namespace {

// Returns `lead` followed by labels a and b: an attention operand's dims.
std::vector<int> lead_then(std::vector<int> lead, int a, int b) {
  lead.push_back(a);
  lead.push_back(b);
  return lead;
}

}  // namespace

DimLabels attention_labels(const Op& op, const std::vector<TensorSpec>& in) {
  const int nb = static_cast<int>(in[0].shape.size()) - 2;
  std::vector<int> lead = label_range(0, nb);
  const int sq = nb, dk = nb + 1, sk = nb + 2, dv = nb + 3;
  auto with = [&](int a, int b) { return lead_then(lead, a, b); };
  DimLabels l;
  l.inputs = {with(sq, dk), with(sk, dk), with(sk, dv)};
  l.unshardable = {dk, sk};
  switch (op.type) {
    case OpType::kAttention:
      l.output = with(sq, dv);
      l.factors = {2};  // linear in v
      break;
    case OpType::kAttentionGradQ:
      l.output = with(sq, dk);
      break;
    case OpType::kAttentionGradK:
      l.output = with(sk, dk);
      break;
    default:
      l.output = with(sk, dv);
      break;
  }
  if (op.type != OpType::kAttention) {
    l.inputs.push_back(with(sq, dv));  // g
    l.factors = {3};                   // linear in g
  }
  return l;
}

double attention_work(std::span<const Op> ops, const std::vector<Shape>& local,
                      const ShardOffsets& offsets) {
  const Dims d = dims_of(local[0], local[1], local[2]);
  const auto [q_off, k_off] = sequence_offsets(local[0].size(), offsets);
  // Score pairs the kernel computes: every (query, key), or with a causal mask the keys up to
  // each block's last query (a later query shard sees more of them).
  double pairs = 0;
  for (std::int64_t r0 = 0; r0 < d.sq; r0 += kBlockRows) {
    const std::int64_t rows = std::min(kBlockRows, d.sq - r0);
    pairs += static_cast<double>(rows) *
             static_cast<double>(block_keys(ops.front(), d, q_off, k_off, r0, rows));
  }
  // A pass computes the scores once (dk); the forward multiplies them by v (dv); grad_v adds
  // Pᵀ g (dv); grad_q and grad_k share g vᵀ (dv) and add dS k or dSᵀ q (dk each).
  const Wanted w = wanted(ops);
  const double per_pair =
      static_cast<double>(d.dk) +
      static_cast<double>(d.dv) * ((w.out ? 1 : 0) + (w.v ? 1 : 0) + (w.q || w.k ? 1 : 0)) +
      static_cast<double>(d.dk) * ((w.q ? 1 : 0) + (w.k ? 1 : 0));
  return static_cast<double>(d.batch) * pairs * per_pair;
}

TensorSpec infer_cached_attention(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  check_operand_dtypes(op.type, std::span(in).first(5), true);
  const Shape &q = in[0].shape, &ck = in[3].shape, &cv = in[4].shape, &pos = in[5].shape;
  const TensorSpec out =
      infer_attention(Op{.type = OpType::kAttention, .causal = true}, {in[0], in[1], in[2]});
  const TensorSpec cached =
      infer_attention(Op{.type = OpType::kAttention, .causal = true}, {in[0], in[3], in[4]});
  if (cached != out || ck.size() != q.size() || cv.size() != q.size() ||
      ck[ck.size() - 2] < q[q.size() - 2]) {
    fail(ErrorKind::kShapeMismatch, "{}: caches {} and {} do not hold q {}'s rows", name,
         to_string(ck), to_string(cv), to_string(q));
  }
  if (in[5].dtype != DType::kInt64 || pos.size() != 1 || pos[0] != q[q.size() - 2]) {
    fail(ErrorKind::kShapeMismatch, "{}: positions {} {} are not one int64 per query row", name,
         to_string(in[5].dtype), to_string(pos));
  }
  return out;
}

namespace {

template <typename T>
void write_rows(const Tensor& rows, Tensor& cache, std::int64_t first) {
  const Shape& s = rows.shape();
  const std::int64_t n = s[s.size() - 2], width = s.back();
  const std::int64_t cap = cache.shape()[s.size() - 2];
  const std::int64_t lead = rows.numel() / std::max<std::int64_t>(1, n * width);
  const T* from = rows.data<T>().data();
  T* to = cache.data<T>().data();
  for (std::int64_t b = 0; b < lead; ++b)
    std::copy_n(from + b * n * width, n * width, to + (b * cap + first) * width);
}

}  // namespace

Tensor cached_attention_kernel(const Op& op, const std::vector<const Tensor*>& in) {
  const std::span<const std::int64_t> pos = in[5]->data<std::int64_t>();
  const std::int64_t first = pos.empty() ? 0 : pos.front();
  const Shape& ck = in[3]->shape();
  const std::int64_t rows = static_cast<std::int64_t>(pos.size());
  MESHFLOW_CHECK(first >= 0 && first + rows <= ck[ck.size() - 2],
                 "{}: positions [{}, {}) past a cache of {}", to_string(op.type), first,
                 first + rows, ck[ck.size() - 2]);
  // The caches are the decoder's state (see the header): written in place.
  auto& cache_k = const_cast<Tensor&>(*in[3]);
  auto& cache_v = const_cast<Tensor&>(*in[4]);
  if (in[0]->dtype() == DType::kFloat64) {
    write_rows<double>(*in[1], cache_k, first);
    write_rows<double>(*in[2], cache_v, first);
  } else {
    write_rows<float>(*in[1], cache_k, first);
    write_rows<float>(*in[2], cache_v, first);
  }
  // Query row i sits at position first + i; the keys past first + rows are masked as the
  // causal mask masks them (and never read).
  const std::size_t rank = in[0]->shape().size();
  ShardOffsets offsets(2, std::vector<std::int64_t>(rank, 0));
  offsets[0][rank - 2] = first;
  return attention_kernel(Op{.type = OpType::kAttention, .causal = true}, {in[0], in[3], in[4]},
                          offsets);
}

DimLabels cached_attention_labels(const std::vector<TensorSpec>& in) {
  const int nb = static_cast<int>(in[0].shape.size()) - 2;
  const std::vector<int> lead = label_range(0, nb);
  const int rows = nb, dk = nb + 1, dv = nb + 2, cap = nb + 3;
  auto with = [&](int a, int b) { return lead_then(lead, a, b); };
  DimLabels l;
  l.inputs = {with(rows, dk), with(rows, dk), with(rows, dv), with(cap, dk), with(cap, dv), {rows}};
  l.output = with(rows, dv);
  l.unshardable = {rows, dk, dv, cap};
  return l;
}

double cached_attention_work(const std::vector<Shape>& local) {
  const Dims d = dims_of(local[0], local[3], local[4]);
  return static_cast<double>(d.batch) * static_cast<double>(d.sq) * static_cast<double>(d.sk) *
         static_cast<double>(d.dk + d.dv);
}

}  // namespace meshflow
