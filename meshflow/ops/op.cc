#include "meshflow/ops/op.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>

#include "meshflow/core/error.h"
#include "meshflow/kernels/accumulate.h"
#include "meshflow/ops/attention.h"
#include "meshflow/ops/elementwise.h"
#include "meshflow/ops/embedding.h"
#include "meshflow/ops/layer_norm.h"
#include "meshflow/ops/matmul.h"
#include "meshflow/ops/reduction.h"
#include "meshflow/ops/softmax.h"
#include "meshflow/ops/view.h"
#include "meshflow/ops/vocab_parallel.h"

namespace meshflow {

namespace {

struct OpInfo {
  OpType type;
  std::string_view name;
  int min_args, max_args;
};

constexpr std::array kOps = {
    OpInfo{OpType::kMatmul, "matmul", 2, 2},
    OpInfo{OpType::kLinear, "linear", 2, 3},
    OpInfo{OpType::kAdd, "add", 2, 2},
    OpInfo{OpType::kSub, "sub", 2, 2},
    OpInfo{OpType::kMul, "mul", 2, 2},
    OpInfo{OpType::kDiv, "div", 2, 2},
    OpInfo{OpType::kNeg, "neg", 1, 1},
    OpInfo{OpType::kRelu, "relu", 1, 1},
    OpInfo{OpType::kGelu, "gelu", 1, 1},
    OpInfo{OpType::kTanh, "tanh", 1, 1},
    OpInfo{OpType::kSigmoid, "sigmoid", 1, 1},
    OpInfo{OpType::kExp, "exp", 1, 1},
    OpInfo{OpType::kSum, "sum", 1, 1},
    OpInfo{OpType::kMean, "mean", 1, 1},
    OpInfo{OpType::kSoftmax, "softmax", 1, 1},
    OpInfo{OpType::kSoftmaxCrossEntropy, "softmax_cross_entropy", 2, 2},
    OpInfo{OpType::kMse, "mse", 2, 2},
    OpInfo{OpType::kReshape, "reshape", 1, 1},
    OpInfo{OpType::kTranspose, "transpose", 1, 1},
    OpInfo{OpType::kLayerNorm, "layer_norm", 3, 3},
    OpInfo{OpType::kEmbedding, "embedding", 2, 2},
    OpInfo{OpType::kAttention, "attention", 3, 3},
    OpInfo{OpType::kSlice, "slice", 1, 1},
    OpInfo{OpType::kMatmulGradA, "matmul_grad_a", 2, 2},
    OpInfo{OpType::kMatmulGradB, "matmul_grad_b", 2, 2},
    OpInfo{OpType::kReluGrad, "relu_grad", 2, 2},
    OpInfo{OpType::kGeluGrad, "gelu_grad", 2, 2},
    OpInfo{OpType::kTanhGrad, "tanh_grad", 2, 2},
    OpInfo{OpType::kSigmoidGrad, "sigmoid_grad", 2, 2},
    OpInfo{OpType::kSoftmaxGrad, "softmax_grad", 2, 2},
    OpInfo{OpType::kSoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad", 3, 3},
    OpInfo{OpType::kMseGrad, "mse_grad", 3, 3},
    OpInfo{OpType::kSumTo, "sum_to", 1, 1},
    OpInfo{OpType::kBroadcastTo, "broadcast_to", 1, 1},
    OpInfo{OpType::kLayerNormStats, "layer_norm_stats", 1, 1},
    OpInfo{OpType::kLayerNormGradX, "layer_norm_grad_x", 4, 4},
    OpInfo{OpType::kLayerNormGradW, "layer_norm_grad_w", 3, 3},
    OpInfo{OpType::kEmbeddingGrad, "embedding_grad", 2, 2},
    OpInfo{OpType::kAttentionGradQ, "attention_grad_q", 4, 4},
    OpInfo{OpType::kAttentionGradK, "attention_grad_k", 4, 4},
    OpInfo{OpType::kAttentionGradV, "attention_grad_v", 4, 4},
    OpInfo{OpType::kSliceGrad, "slice_grad", 1, 1},
    OpInfo{OpType::kLogitMax, "logit_max", 1, 1},
    OpInfo{OpType::kLogitStats, "logit_stats", 3, 3},
    OpInfo{OpType::kCrossEntropyFromStats, "cross_entropy_from_stats", 2, 2},
    OpInfo{OpType::kCrossEntropyGradFromStats, "cross_entropy_grad_from_stats", 5, 5},
    OpInfo{OpType::kCachedAttention, "cached_attention", 6, 6},
};

const OpInfo& info(OpType type) {
  for (const OpInfo& i : kOps)
    if (i.type == type) return i;
  MESHFLOW_CHECK(false, "unknown OpType {}", static_cast<int>(type));
}

int normalize_dim(std::string_view name, int dim, std::size_t rank) {
  const int r = static_cast<int>(rank);
  if (dim < -r || dim >= r) {
    fail(ErrorKind::kInvalidArgument, "{}: dim {} is out of range for a {}-d operand", name, dim,
         rank);
  }
  return dim < 0 ? dim + r : dim;
}

}  // namespace

std::string_view to_string(OpType type) { return info(type).name; }

OpType parse_op_type(std::string_view name) {
  for (const OpInfo& i : kOps)
    if (i.name == name) return i.type;
  fail(ErrorKind::kInvalidArgument, "unknown operator \"{}\"", name);
}

std::string to_string(const Op& op) {
  std::string s(to_string(op.type));
  std::vector<std::string> attrs;
  if (!op.dims.empty() || op.type == OpType::kSum || op.type == OpType::kMean)
    attrs.push_back(fmt::format("dims=[{}]", fmt::join(op.dims, ",")));
  if (op.type == OpType::kSoftmax || op.type == OpType::kSoftmaxGrad)
    attrs.push_back(fmt::format("dim={}", op.dim));
  if (op.type == OpType::kSumTo || op.type == OpType::kBroadcastTo || op.type == OpType::kReshape ||
      op.type == OpType::kEmbeddingGrad || op.type == OpType::kSliceGrad)
    attrs.push_back("shape=" + to_string(op.shape));
  if (op.type == OpType::kSlice || op.type == OpType::kSliceGrad)
    attrs.push_back(fmt::format("dim={}, start={}, end={}", op.dim, op.start, op.end));
  if (op.weight_out_in) attrs.push_back("weight=out_in");
  if (op.scale != 1) attrs.push_back(fmt::format("scale={}", op.scale));
  if (op.type == OpType::kLayerNorm || op.type == OpType::kLayerNormStats)
    attrs.push_back(fmt::format("eps={}", op.eps));
  if (op.causal) attrs.push_back("causal");
  if (op.approximate_tanh) attrs.push_back("approximate=tanh");
  if (!attrs.empty()) s += fmt::format("({})", fmt::join(attrs, ", "));
  return s;
}

std::size_t hash_value(const Op& op) {
  std::size_t h = static_cast<std::size_t>(op.type) * 0x9e3779b97f4a7c15ULL;
  auto mix = [&](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int d : op.dims) mix(static_cast<std::size_t>(d));
  mix(static_cast<std::size_t>(op.dim));
  for (std::int64_t s : op.shape) mix(static_cast<std::size_t>(s));
  mix(std::hash<double>{}(op.scale));
  mix(std::hash<double>{}(op.eps));
  mix(op.causal ? 1 : 0);
  mix(op.approximate_tanh ? 1 : 0);
  mix(static_cast<std::size_t>(op.start));
  mix(static_cast<std::size_t>(op.end));
  mix(op.weight_out_in ? 1 : 0);
  return h;
}

std::pair<int, int> arity(OpType type) { return {info(type).min_args, info(type).max_args}; }

void check_operand_dtypes(OpType type, std::span<const TensorSpec> in, bool floating_only) {
  const std::string_view name = to_string(type);
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (floating_only && !is_floating(in[i].dtype)) {
      fail(ErrorKind::kInvalidArgument, "{}: operand {} is {}; {} takes float32 or float64", name,
           i, to_string(in[i].dtype), name);
    }
    if (in[i].dtype != in[0].dtype) {
      fail(ErrorKind::kInvalidArgument, "{}: operands are {} and {} (no implicit promotion)", name,
           to_string(in[0].dtype), to_string(in[i].dtype));
    }
  }
}

Op normalize(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  const auto [lo, hi] = arity(op.type);
  const int n = static_cast<int>(in.size());
  if (n < lo || n > hi) {
    fail(ErrorKind::kInvalidArgument, "{} takes {} operands, got {}", name,
         lo == hi ? fmt::format("{}", lo) : fmt::format("{} or {}", lo, hi), n);
  }
  Op out = op;
  if (op.type == OpType::kSum || op.type == OpType::kMean) {
    for (int& d : out.dims) d = normalize_dim(name, d, in[0].shape.size());
    std::sort(out.dims.begin(), out.dims.end());
    if (std::adjacent_find(out.dims.begin(), out.dims.end()) != out.dims.end())
      fail(ErrorKind::kInvalidArgument, "{}: dims [{}] repeat a dim", name,
           fmt::join(op.dims, ","));
  }
  if (op.type == OpType::kBroadcastTo) {
    for (int& d : out.dims) d = normalize_dim(name, d, op.shape.size());
    std::sort(out.dims.begin(), out.dims.end());
  }
  if (op.type == OpType::kSoftmax || op.type == OpType::kSoftmaxGrad) {
    if (in[0].shape.empty()) fail(ErrorKind::kInvalidArgument, "{}: operand is a scalar", name);
    out.dim = normalize_dim(name, op.dim, in[0].shape.size());
  }
  if (is_view_family(op.type)) out = normalize_view(out, in);
  return out;
}

TensorSpec infer(const Op& raw, const std::vector<TensorSpec>& in) {
  const Op op = normalize(raw, in);
  if (is_binary(op.type) || is_unary(op.type) || is_unary_grad(op.type))
    return infer_elementwise(op, in);
  if (is_matmul_family(op.type)) return infer_matmul(op, in);
  if (is_reduction_family(op.type)) return infer_reduction(op, in);
  if (is_view_family(op.type)) return infer_view(op, in);
  if (is_layer_norm_family(op.type)) return infer_layer_norm(op, in);
  if (is_embedding_family(op.type)) return infer_embedding(op, in);
  if (is_attention_family(op.type)) return infer_attention(op, in);
  if (op.type == OpType::kCachedAttention) return infer_cached_attention(op, in);
  if (is_vocab_parallel_family(op.type)) return infer_vocab_parallel(op, in);
  return infer_softmax(op, in);
}

Tensor compute(const Op& op, const std::vector<const Tensor*>& inputs) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : inputs) specs.push_back(spec_of(*t));
  infer(op, specs);
  return run_kernel(normalize(op, specs), inputs, specs);
}

Tensor run_kernel(const Op& op, const std::vector<const Tensor*>& locals,
                  const std::vector<TensorSpec>& globals, const ShardOffsets& offsets) {
  if (is_binary(op.type) || is_unary(op.type) || is_unary_grad(op.type))
    return elementwise_kernel(op, locals);
  if (is_matmul_family(op.type)) return matmul_kernel(op, locals);
  if (is_reduction_family(op.type)) return reduction_kernel(op, locals, globals);
  if (is_view_family(op.type)) return view_kernel(op, locals, globals);
  if (is_layer_norm_family(op.type)) return layer_norm_kernel(op, locals);
  if (is_embedding_family(op.type)) return embedding_kernel(op, locals, globals, offsets);
  if (is_attention_family(op.type)) return attention_kernel(op, locals, offsets);
  if (op.type == OpType::kCachedAttention) return cached_attention_kernel(op, locals);
  if (is_vocab_parallel_family(op.type)) return vocab_parallel_kernel(op, locals, globals, offsets);
  return softmax_kernel(op, locals, globals);
}

void run_kernel_accumulate(const Op& op, const std::vector<const Tensor*>& locals,
                           const std::vector<TensorSpec>& globals, const ShardOffsets& offsets,
                           Tensor& sum) {
  if (is_matmul_family(op.type) && is_floating(sum.dtype())) {
    matmul_kernel_accumulate(op, locals, sum);
    return;
  }
  const Tensor made = run_kernel(op, locals, globals, offsets);
  MESHFLOW_CHECK(made.shape() == sum.shape() && made.dtype() == sum.dtype(),
                 "{}: accumulating a {} result into {}", to_string(op.type),
                 to_string(made.shape()), to_string(sum.shape()));
  add_into(sum, made);
}

bool runs_together(const Op& a, const Op& b, const std::vector<TensorSpec>& operands) {
  const auto grad = [](OpType t) { return is_attention_family(t) && t != OpType::kAttention; };
  if (grad(a.type) && grad(b.type))
    return a.type != b.type && a.causal == b.causal && operands.size() == 4;
  return layer_norm_runs_together(a, b, operands);
}

namespace {

// The first arity(op) of `all`.
template <typename T>
std::vector<T> operands_of(const Op& op, const std::vector<T>& all) {
  const auto n = std::min(all.size(), static_cast<std::size_t>(arity(op.type).second));
  return {all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)};
}

}  // namespace

std::vector<Tensor> run_kernels(std::span<const Op> ops, const std::vector<const Tensor*>& locals,
                                const std::vector<TensorSpec>& globals,
                                const ShardOffsets& offsets) {
  MESHFLOW_CHECK(!ops.empty());
  if (ops.size() == 1) {
    std::vector<Tensor> out;
    out.push_back(run_kernel(ops.front(), locals, globals, offsets));
    return out;
  }
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (std::size_t j = i + 1; j < ops.size(); ++j)
      MESHFLOW_CHECK(runs_together(ops[i], ops[j], globals), "{} and {} do not run as one kernel",
                     to_string(ops[i].type), to_string(ops[j].type));
  if (is_attention_family(ops.front().type)) return attention_kernels(ops, locals, offsets);
  return layer_norm_kernels(ops, locals);
}

DimLabels dim_labels(const Op& op, const std::vector<TensorSpec>& in) {
  const Shape out = infer(op, in).shape;
  if (is_binary(op.type) || is_unary(op.type) || is_unary_grad(op.type))
    return elementwise_labels(op, in, out);
  if (is_matmul_family(op.type)) return matmul_labels(op, in, out);
  if (is_reduction_family(op.type)) return reduction_labels(op, in, out);
  if (is_view_family(op.type)) return view_labels(op, in, out);
  if (is_layer_norm_family(op.type)) return layer_norm_labels(op, in);
  if (is_embedding_family(op.type)) return embedding_labels(op, in);
  if (is_attention_family(op.type)) return attention_labels(op, in);
  if (op.type == OpType::kCachedAttention) return cached_attention_labels(in);
  if (is_vocab_parallel_family(op.type)) return vocab_parallel_labels(op, in);
  return softmax_labels(op, in, out);
}

double work_points(const Op& op, const std::vector<TensorSpec>& globals,
                   const std::vector<Shape>& local, const Shape& local_out,
                   const ShardOffsets& offsets) {
  MESHFLOW_CHECK(local.size() == globals.size());
  // one copy (views), one row copy or add per id (embedding)
  if (is_view_family(op.type) || is_embedding_family(op.type))
    return static_cast<double>(numel(local_out));
  if (is_attention_family(op.type)) return attention_work({&op, 1}, local, offsets);
  if (op.type == OpType::kCachedAttention) return cached_attention_work(local);
  if (is_layer_norm_family(op.type)) return layer_norm_work(op, local);
  const DimLabels labels = dim_labels(op, globals);
  std::map<int, std::int64_t> extent;
  auto take = [&](const std::vector<int>& dims, const Shape& shape) {
    for (std::size_t d = 0; d < dims.size() && d < shape.size(); ++d) {
      if (dims[d] == kBroadcastLabel) continue;
      std::int64_t& e = extent[dims[d]];
      e = std::max(e, shape[d]);
    }
  };
  for (std::size_t i = 0; i < local.size(); ++i) take(labels.inputs[i], local[i]);
  take(labels.output, local_out);
  double points = 1;
  for (const auto& [label, e] : extent) points *= static_cast<double>(e);
  return points;
}

double work_points(std::span<const Op> ops, const std::vector<TensorSpec>& globals,
                   const std::vector<Shape>& local, const std::vector<Shape>& local_outs,
                   const ShardOffsets& offsets) {
  MESHFLOW_CHECK(!ops.empty() && local_outs.size() == ops.size());
  if (ops.size() > 1 && is_attention_family(ops.front().type))
    return attention_work(ops, local, offsets);
  double points = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    // The forward pass keeps layer norm's statistics as it makes them: no pass of their own.
    if (ops.size() > 1 && ops[i].type == OpType::kLayerNormStats) continue;
    const std::vector<Shape> in = operands_of(ops[i], local);
    ShardOffsets at = offsets;
    if (at.size() > in.size()) at.resize(in.size());
    points += work_points(ops[i], operands_of(ops[i], globals), in, local_outs[i], at);
  }
  return points;
}

std::vector<int> label_range(int from, int to) {
  std::vector<int> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<int> broadcast_labels(const Shape& operand, const Shape& out) {
  std::vector<int> labels;
  const std::size_t shift = out.size() - operand.size();
  for (std::size_t i = 0; i < operand.size(); ++i) {
    const bool stretched = operand[i] == 1 && out[i + shift] != 1;
    labels.push_back(stretched ? kBroadcastLabel : static_cast<int>(i + shift));
  }
  return labels;
}

}  // namespace meshflow
