#include "meshflow/ops/gradient.h"

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

using Kind = GradRef::Kind;
constexpr GradRef kG{Kind::kGrad, 0};
constexpr GradRef kOut{Kind::kOutput, 0};
GradRef input(int i) { return {Kind::kInput, i}; }

// Builds a program step by step.
struct Builder {
  GradProgram p;
  GradRef add(Op op, std::vector<GradRef> args) {
    p.steps.push_back({std::move(op), std::move(args)});
    return {Kind::kStep, static_cast<int>(p.steps.size()) - 1};
  }
  GradRef op(OpType type, std::vector<GradRef> args) {
    return add(Op{.type = type}, std::move(args));
  }
  // `value` (of the result's shape) summed down to `shape` when broadcasting stretched it.
  GradRef sum_to(GradRef value, const Shape& shape, const Shape& out_shape) {
    if (shape == out_shape) return value;
    return add(Op{.type = OpType::kSumTo, .shape = shape}, {value});
  }
};

}  // namespace

GradProgram gradient_program(const Op& raw, const std::vector<TensorSpec>& in) {
  const Op op = normalize(raw, in);
  const Shape out = infer(op, in).shape;
  Builder b;
  auto& grads = b.p.input_grads;
  switch (op.type) {
    case OpType::kAdd:
    case OpType::kSub:
      grads = {b.sum_to(kG, in[0].shape, out),
               b.sum_to(op.type == OpType::kAdd ? kG : b.op(OpType::kNeg, {kG}), in[1].shape, out)};
      break;
    case OpType::kMul:
      grads = {b.sum_to(b.op(OpType::kMul, {kG, input(1)}), in[0].shape, out),
               b.sum_to(b.op(OpType::kMul, {kG, input(0)}), in[1].shape, out)};
      break;
    case OpType::kDiv: {  // d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b
      const GradRef g_over_b = b.op(OpType::kDiv, {kG, input(1)});
      const GradRef gb = b.op(OpType::kNeg, {b.op(OpType::kMul, {g_over_b, kOut})});
      grads = {b.sum_to(g_over_b, in[0].shape, out), b.sum_to(gb, in[1].shape, out)};
      break;
    }
    case OpType::kNeg:
      grads = {b.op(OpType::kNeg, {kG})};
      break;
    case OpType::kRelu:
      grads = {b.op(OpType::kReluGrad, {kG, input(0)})};
      break;
    case OpType::kGelu:
      grads = {b.add(Op{.type = OpType::kGeluGrad, .approximate_tanh = op.approximate_tanh},
                     {kG, input(0)})};
      break;
    case OpType::kTanh:
      grads = {b.op(OpType::kTanhGrad, {kG, kOut})};
      break;
    case OpType::kSigmoid:
      grads = {b.op(OpType::kSigmoidGrad, {kG, kOut})};
      break;
    case OpType::kExp:
      grads = {b.op(OpType::kMul, {kG, kOut})};
      break;
    case OpType::kSum:
    case OpType::kMean: {
      double scale = 1;
      if (op.type == OpType::kMean) {
        std::int64_t count = 1;
        for (int d : op.dims) count *= in[0].shape[static_cast<std::size_t>(d)];
        scale = 1.0 / static_cast<double>(count);
      }
      grads = {b.add(
          Op{.type = OpType::kBroadcastTo, .dims = op.dims, .shape = in[0].shape, .scale = scale},
          {kG})};
      break;
    }
    case OpType::kSoftmax:
      grads = {b.add(Op{.type = OpType::kSoftmaxGrad, .dim = op.dim}, {kG, kOut})};
      break;
    case OpType::kSoftmaxCrossEntropy:
      grads = {b.op(OpType::kSoftmaxCrossEntropyGrad, {input(0), input(1), kG}), std::nullopt};
      break;
    case OpType::kMse: {
      const GradRef ga = b.op(OpType::kMseGrad, {input(0), input(1), kG});
      grads = {ga, b.op(OpType::kNeg, {ga})};
      break;
    }
    case OpType::kMatmul:
    case OpType::kLinear:
      if (op.weight_out_in) {  // y = x @ wᵀ: dx = g @ w, dw = Σ gᵀ x ([out, in])
        grads = {b.op(OpType::kMatmul, {kG, input(1)}), b.op(OpType::kMatmulGradB, {kG, input(0)})};
      } else {
        grads = {b.op(OpType::kMatmulGradA, {kG, input(1)}),
                 b.op(OpType::kMatmulGradB, {input(0), kG})};
      }
      if (in.size() == 3) grads.push_back(b.sum_to(kG, in[2].shape, out));
      break;
    case OpType::kMatmulGradA:  // a @ bᵀ (a matmul whose b is a folded transpose)
      grads = {b.op(OpType::kMatmul, {kG, input(1)}), b.op(OpType::kMatmulGradB, {kG, input(0)})};
      break;
    case OpType::kMatmulGradB:  // Σ aᵀ g (a matmul whose a is a folded transpose)
      grads = {b.op(OpType::kMatmulGradA, {input(1), kG}), b.op(OpType::kMatmul, {input(0), kG})};
      break;
    case OpType::kLayerNorm: {  // the statistics read x alone: the graph keeps the forward's
      const GradRef stats = b.add(Op{.type = OpType::kLayerNormStats, .eps = op.eps}, {input(0)});
      grads = {b.add(Op{.type = OpType::kLayerNormGradX}, {kG, input(0), input(1), stats}),
               b.add(Op{.type = OpType::kLayerNormGradW}, {kG, input(0), stats}),
               b.sum_to(kG, in[2].shape, out)};
      break;
    }
    case OpType::kEmbedding:
      grads = {std::nullopt,
               b.add(Op{.type = OpType::kEmbeddingGrad, .shape = in[1].shape}, {input(0), kG})};
      break;
    case OpType::kAttention: {
      const std::vector<GradRef> args = {input(0), input(1), input(2), kG};
      grads = {b.add(Op{.type = OpType::kAttentionGradQ, .causal = op.causal}, args),
               b.add(Op{.type = OpType::kAttentionGradK, .causal = op.causal}, args),
               b.add(Op{.type = OpType::kAttentionGradV, .causal = op.causal}, args)};
      break;
    }
    case OpType::kReshape:
      grads = {b.add(Op{.type = OpType::kReshape, .shape = in[0].shape}, {kG})};
      break;
    case OpType::kSlice:
      grads = {b.add(Op{.type = OpType::kSliceGrad,
                        .dim = op.dim,
                        .shape = in[0].shape,
                        .start = op.start,
                        .end = op.end},
                     {kG})};
      break;
    case OpType::kSliceGrad:
      grads = {
          b.add(Op{.type = OpType::kSlice, .dim = op.dim, .start = op.start, .end = op.end}, {kG})};
      break;
    case OpType::kTranspose: {
      std::vector<int> inverse(op.dims.size());
      for (std::size_t j = 0; j < op.dims.size(); ++j)
        inverse[static_cast<std::size_t>(op.dims[j])] = static_cast<int>(j);
      grads = {b.add(Op{.type = OpType::kTranspose, .dims = inverse}, {kG})};
      break;
    }
    default:
      fail(ErrorKind::kInvalidArgument, "{} has no gradient rule (it is itself a gradient)",
           to_string(op.type));
  }
  return std::move(b.p);
}

std::vector<std::optional<Tensor>> compute_backward(const Op& op,
                                                    const std::vector<const Tensor*>& operands,
                                                    const Tensor& output, const Tensor& grad) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : operands) specs.push_back(spec_of(*t));
  return run_gradient_program(
      gradient_program(op, specs), operands, output, grad,
      [](const Op& step, const std::vector<const Tensor*>& args) { return compute(step, args); },
      [](const Tensor& t) { return t.clone(); });
}

}  // namespace meshflow
