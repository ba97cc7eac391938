// Operators: what an operator is (its type and attributes), its shape and dtype rule, its
// sharding rule (dim labels), and the one entry point that runs its CPU kernel on local tensors.
// Each family keeps these in its own file (elementwise, matmul, reduction, softmax, view,
// layer_norm, embedding, attention, vocab_parallel); this file dispatches to them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/core/reduce_op.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

// The operators of DESIGN.md's "Models" list, and the gradient operators their backward passes
// are written in (ops/gradient.h).
enum class OpType {
  // forward
  kMatmul,  // a[..., m, k] @ b[k, n]
  kLinear,  // x[..., in] @ w[in, out] (+ b[out]); with weight_out_in, x @ w[out, in]ᵀ (+ b[out])
  kAdd,     // NumPy broadcasting, as are sub, mul and div
  kSub,
  kMul,
  kDiv,
  kNeg,
  kRelu,
  kGelu,  // erf form (or, with approximate_tanh, PyTorch's tanh form)
  kTanh,
  kSigmoid,
  kExp,
  kSum,                  // over `dims`, dims dropped
  kMean,                 // over `dims`, dims dropped
  kSoftmax,              // over `dim`
  kSoftmaxCrossEntropy,  // (logits[B, C], labels[B]) -> mean over B of -log softmax[label]
  kMse,                  // (a, b) -> mean of (a - b)^2
  kReshape,              // C order to `shape` (one -1 allowed)
  kTranspose,            // dims permuted: result dim j is operand dim dims[j] (empty: reversed)
  kLayerNorm,            // (x[..., D], w[D], b[D]) over the last dim, `eps`
  kEmbedding,            // (ids[...] int32/int64, table[V, D]) -> table[ids], [..., D]
  kAttention,            // (q[..., Sq, Dk], k[..., Sk, Dk], v[..., Sk, Dv]), `causal`
  kSlice,                // x[..., start:end, ...] on `dim` (NumPy's basic slice, step 1)
  // gradients
  kMatmulGradA,  // (g[..., m, n], b[k, n]) -> g @ bᵀ, [..., m, k]
  kMatmulGradB,  // (a[..., m, k], g[..., m, n]) -> Σ over leading dims of aᵀ @ g, [k, n]
  kReluGrad,     // (g, x) -> g * (x > 0)
  kGeluGrad,     // (g, x) -> g * gelu'(x)
  kTanhGrad,     // (g, y) -> g * (1 - y²), y = tanh(x)
  kSigmoidGrad,  // (g, y) -> g * y * (1 - y), y = sigmoid(x)
  kSoftmaxGrad,  // (g, y) -> y * (g - Σ_dim g * y), y = softmax(x) over `dim`
  kSoftmaxCrossEntropyGrad,  // (logits, labels, g[]) -> g * (softmax(logits) - onehot) / B
  kMseGrad,                  // (a, b, g[]) -> g * 2 (a - b) / numel
  kSumTo,                    // (g) -> g summed down to `shape` (the inverse of broadcasting)
  kBroadcastTo,              // (g) -> g with `dims` inserted, broadcast to `shape`, times `scale`
  kLayerNormStats,  // (x[..., D]) -> each row's statistics [..., 3] (ops/layer_norm.h), `eps`
  kLayerNormGradX,  // (g, x, w, stats) -> the gradient of x
  kLayerNormGradW,  // (g, x, stats) -> Σ over leading dims of g * x̂, [D]
  kEmbeddingGrad,   // (ids, g[..., D]) -> g's rows added at ids into zeros of `shape`
  kAttentionGradQ,  // (q, k, v, g) -> the gradient of q, `causal`
  kAttentionGradK,  // (q, k, v, g) -> the gradient of k, `causal`
  kAttentionGradV,  // (q, k, v, g) -> the gradient of v, `causal`
  kSliceGrad,       // (g) -> zeros of `shape` with g at [start, end) on `dim`
  // the vocabulary-parallel cross-entropy's steps (ops/vocab_parallel.h)
  kLogitMax,                   // (logits[B, C]) -> max over C, [B]
  kLogitStats,                 // (logits, max[B], labels[B]) -> [B, 2]: Σ exp(x - max), x[label]
  kCrossEntropyFromStats,      // (max, stats) -> mean over B of max + log stats[:, 0] - stats[:, 1]
  kCrossEntropyGradFromStats,  // (logits, labels, max, stats, g[]) -> the logits' gradient
  // the decoder's attention over its KV cache (ops/attention.h; made by infer/, not a model file)
  kCachedAttention,  // (q, k, v, cache_k, cache_v, positions[L] int64)
};

// An operator with its attributes. Fields an operator does not use keep their defaults, so
// equal operators compare (and hash) equal.
struct Op {
  OpType type = OpType::kAdd;
  std::vector<int> dims;  // sum, mean: reduced dims; broadcast_to: inserted dims (sorted);
                          // transpose: the permutation
  int dim = -1;           // softmax, softmax_grad, slice, slice_grad
  Shape shape;            // sum_to, broadcast_to, reshape, embedding_grad: the result's shape
  double scale = 1;       // broadcast_to
  double eps = 1e-5;      // layer_norm and layer_norm_stats
  bool causal = false;    // attention and its gradients
  // gelu and gelu_grad: PyTorch's approximate="tanh" form, 0.5 x (1 + tanh(√(2/π) (x + 0.044715
  // x³))), instead of the erf form.
  bool approximate_tanh = false;
  // slice and slice_grad: the range [start, end) on `dim` (NumPy's: negative counts from the end,
  // clamped to the extent; normalize resolves them to 0 <= start <= end <= extent).
  std::int64_t start = 0, end = 0;
  // linear: the weight is PyTorch's [out, in] (x @ wᵀ + b) instead of [in, out].
  bool weight_out_in = false;
  bool operator==(const Op&) const = default;
};

// The shape and dtype of an operator's operand or result.
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kFloat32;
  bool operator==(const TensorSpec&) const = default;
};

// Returns "matmul", "softmax_cross_entropy", "relu_grad", ... (the model-file names).
std::string_view to_string(OpType type);
// Returns the operator named `name`; throws Error naming it.
OpType parse_op_type(std::string_view name);
// Returns "sum(dims=[0,1])", "softmax(dim=-1)", "add".
std::string to_string(const Op& op);
std::size_t hash_value(const Op& op);

// Returns the numbers of operands `type` accepts: {min, max} (linear takes 2 or 3).
std::pair<int, int> arity(OpType type);

// Returns the result's shape and dtype; throws Error (kShapeMismatch or kInvalidArgument)
// naming the operator and the offending operand for a wrong operand count, shapes that do not
// fit, a dim out of range or a dtype the operator does not take.
TensorSpec infer(const Op& op, const std::vector<TensorSpec>& inputs);

// Throws Error(kInvalidArgument) naming the operator and the operand unless every operand of
// `operands` has operand 0's dtype (no implicit promotion) and, when `floating_only`, that dtype
// is float32 or float64. Operand numbers count from the span's start.
void check_operand_dtypes(OpType type, std::span<const TensorSpec> operands, bool floating_only);

// Returns op with its dims normalised against the operand shapes (negative dims counted from the
// end, reduced dims sorted): the form strategies and caches use.
Op normalize(const Op& op, const std::vector<TensorSpec>& inputs);

// Runs the operator on whole tensors on one device (normalises, checks, runs the kernel): the
// single-device reference every distributed result is compared with.
Tensor compute(const Op& op, const std::vector<const Tensor*>& inputs);

// Where a device's operand shards start in the global operands: per operand, per dim (empty:
// every shard starts at 0, as on one device). Kernels that index by global position read it
// (embedding's vocabulary rows, attention's causal mask).
using ShardOffsets = std::vector<std::vector<std::int64_t>>;

// Runs the operator's CPU kernel on local tensors; `op` is as normalize returns it. `globals` are
// the global operand specs (reductions divide by global counts, so a shard's mean is its term of
// the global mean); for a single device they are the locals' own specs. Returns a tensor of the
// local result shape the locals imply.
Tensor run_kernel(const Op& op, const std::vector<const Tensor*>& locals,
                  const std::vector<TensorSpec>& globals, const ShardOffsets& offsets = {});

// sum += run_kernel(op, locals, globals, offsets); `sum` has the result's local shape and dtype.
// A matrix product adds in its GEMM (beta = 1), with no temporary; other kernels add their
// result.
void run_kernel_accumulate(const Op& op, const std::vector<const Tensor*>& locals,
                           const std::vector<TensorSpec>& globals, const ShardOffsets& offsets,
                           Tensor& sum);

// Returns whether `a` and `b` run as one kernel (run_kernels), each reading the first arity of
// `operands` (so one's operand list is a prefix of the other's): two of attention's gradients of
// the same operands (ops/attention.h; they share the probabilities), layer_norm(x, w, b) and
// layer_norm_stats(x) (one pass keeps the statistics it makes), or layer_norm_grad_w(g, x, stats)
// and its bias's sum_to(g, [D]) (ops/layer_norm.h; one pass over g).
bool runs_together(const Op& a, const Op& b, const std::vector<TensorSpec>& operands);

// Runs `ops` (distinct, each pair runs_together on `globals`) in one kernel, each on the first
// arity of `locals`, as run_kernel does each; returns their results in order, each bit for bit
// what run_kernel gives it alone.
std::vector<Tensor> run_kernels(std::span<const Op> ops, const std::vector<const Tensor*>& locals,
                                const std::vector<TensorSpec>& globals,
                                const ShardOffsets& offsets = {});

// The sharding rule of an operator (ops/strategy.h turns it into strategies): dims of operands
// and result that carry the same label index the same elements; a label on operands but not on
// the result is summed away.
inline constexpr int kBroadcastLabel = -1;  // a size-1 operand dim stretched by broadcasting

struct DimLabels {
  std::vector<std::vector<int>> inputs;  // per operand, per dim: a label or kBroadcastLabel
  std::vector<int> output;               // per result dim
  std::vector<int> unshardable;          // labels no strategy shards
  // Labels the kernel reduces through per-row statistics (a loss's class dim): a strategy that
  // shards one runs the operator lowered into steps that all-reduce the statistics
  // (ops/vocab_parallel.h); the result keeps its own dims' labels and is whole over the rest.
  std::vector<int> statistics;
  ReduceOp reduce = ReduceOp::kSum;  // how the terms of a summed-away label combine
  std::vector<int> factors;          // operands the result is linear in one at a time
  std::vector<int> terms;            // operands the result is linear in all together
};

// Returns the labels of `op` (as normalize returns it) on operands of `inputs` specs; each
// family file states its operators' labels.
DimLabels dim_labels(const Op& op, const std::vector<TensorSpec>& inputs);

// Returns the multiply-adds (or elementwise steps) of `op`'s kernel (op as normalize returns it,
// on operands of `globals` specs) run on operands of `local` shapes giving a result of
// `local_out` shape: the product of the extents of every label (1 for a scalar); a causal
// attention's also depends on where its shards start (`offsets`, as run_kernel takes them). What
// the cost model prices a kernel by (plan/cost_model.h, kernel_seconds).
double work_points(const Op& op, const std::vector<TensorSpec>& globals,
                   const std::vector<Shape>& local, const Shape& local_out,
                   const ShardOffsets& offsets = {});

// Returns the multiply-adds (or elementwise steps) of run_kernels(ops, ...) on operands of
// `local` shapes giving `local_outs`: attention's shared products once, else each op's
// work_points on its operands.
double work_points(std::span<const Op> ops, const std::vector<TensorSpec>& globals,
                   const std::vector<Shape>& local, const std::vector<Shape>& local_outs,
                   const ShardOffsets& offsets = {});

// Returns the labels from, from + 1, ..., to - 1.
std::vector<int> label_range(int from, int to);

// Returns the labels of an operand of `operand` shape broadcast against a result of `out` shape:
// aligned at the last dim, a stretched size-1 dim is kBroadcastLabel.
std::vector<int> broadcast_labels(const Shape& operand, const Shape& out);

// Returns the spec of `t`.
inline TensorSpec spec_of(const Tensor& t) { return {t.shape(), t.dtype()}; }

}  // namespace meshflow
