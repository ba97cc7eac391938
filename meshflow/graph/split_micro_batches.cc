// Micro-batching (graph/passes.h): every batch input's dim 0 divided by M, the batch dim
// followed through the graph to check that each node keeps rows apart, every spec re-inferred.
#include <fmt/format.h>

#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/graph/passes.h"

namespace meshflow {

namespace {

// Where a value's rows are: the position of the batch dim, none for values no batch input
// reaches, or kAveraged for a scalar that already took the mean over the rows (a loss).
constexpr int kNone = -1;
constexpr int kAveraged = -2;

struct Tracker {
  const Pcg& pcg;
  int micro_batches;
  std::vector<int> batch_dim;  // per value

  [[noreturn]] void refuse(const Node& n, std::string_view why) const {
    fail(ErrorKind::kInvalidArgument, "node \"{}\" {}: it cannot run in {} micro-batches", n.name,
         why, micro_batches);
  }

  int of(ValueId v) const { return batch_dim[static_cast<std::size_t>(v)]; }
  std::size_t rank(ValueId v) const {
    return pcg.nodes[static_cast<std::size_t>(v)].spec.shape.size();
  }

  // Returns the batch dim of compute node `n`'s result, or refuses the node.
  int compute(const Node& n, bool is_loss) const {
    std::vector<int> dims;
    bool any = false;
    for (ValueId v : n.inputs) {
      dims.push_back(of(v));
      any = any || of(v) != kNone;
    }
    if (!any) return kNone;
    for (int d : dims)
      if (d == kAveraged) refuse(n, "uses a loss already averaged over the rows");
    const int p = dims[0];
    const std::size_t r = rank(n.inputs[0]);
    const auto out_rank = static_cast<int>(n.spec.shape.size());
    auto only_first = [&] {
      for (std::size_t i = 1; i < dims.size(); ++i)
        if (dims[i] != kNone) refuse(n, "reads rows in an operand other than its first");
      if (p == kNone) refuse(n, "reads rows in an operand other than its first");
    };
    auto row_mean = [&](std::string_view what) {
      if (!is_loss) refuse(n, fmt::format("{} over the rows before the loss", what));
      return kAveraged;
    };
    switch (n.op.type) {
      case OpType::kAdd:
      case OpType::kSub:
      case OpType::kMul:
      case OpType::kDiv: {
        // NumPy broadcasting aligns dims from the right.
        int out = kNone;
        for (std::size_t i = 0; i < dims.size(); ++i) {
          if (dims[i] == kNone) continue;
          const int at = dims[i] + out_rank - static_cast<int>(rank(n.inputs[i]));
          if (out != kNone && out != at) refuse(n, "pairs rows of its operands at different dims");
          out = at;
        }
        return out;
      }
      case OpType::kNeg:
      case OpType::kRelu:
      case OpType::kGelu:
      case OpType::kTanh:
      case OpType::kSigmoid:
      case OpType::kExp:
        return p;
      case OpType::kMatmul:
      case OpType::kLinear:
        only_first();
        if (p == static_cast<int>(r) - 1) refuse(n, "contracts over the rows");
        return p;
      case OpType::kSum:
      case OpType::kMean: {
        if (std::find(n.op.dims.begin(), n.op.dims.end(), p) != n.op.dims.end()) {
          if (n.op.type == OpType::kSum) {
            refuse(n, is_loss ? "is a sum over the rows (a loss must be a mean)"
                              : "sums over the rows before the loss");
          }
          return row_mean("averages");
        }
        int at = p;
        for (int d : n.op.dims) at -= d < p ? 1 : 0;
        return at;
      }
      case OpType::kSoftmax: {
        const int dim = n.op.dim < 0 ? n.op.dim + static_cast<int>(r) : n.op.dim;
        if (dim == p) refuse(n, "normalises over the rows");
        return p;
      }
      case OpType::kSoftmaxCrossEntropy:
      case OpType::kMse:
        for (int d : dims)
          if (d != p) refuse(n, "pairs rows of its operands at different dims");
        if (n.op.type == OpType::kSoftmaxCrossEntropy && p != 0)
          refuse(n, "has its rows off dim 0 of the logits");
        return row_mean("averages");
      case OpType::kReshape:
        if (p != 0) refuse(n, fmt::format("reshapes a value whose rows are on dim {}", p));
        if (n.op.shape.empty() || n.op.shape[0] != -1) {
          refuse(n, fmt::format("fixes dim 0 to {} (write the rows' dim as -1)",
                                n.op.shape.empty() ? 0 : n.op.shape[0]));
        }
        return 0;
      case OpType::kSlice: {
        const int dim = n.op.dim < 0 ? n.op.dim + static_cast<int>(r) : n.op.dim;
        if (dim == p) refuse(n, "slices the rows");
        return p;
      }
      case OpType::kTranspose: {
        std::vector<int> perm = n.op.dims;
        if (perm.empty())
          for (int d = static_cast<int>(r); d-- > 0;) perm.push_back(d);
        return static_cast<int>(std::find(perm.begin(), perm.end(), p) - perm.begin());
      }
      case OpType::kLayerNorm:
        only_first();
        if (p == static_cast<int>(r) - 1) refuse(n, "normalises over the rows");
        return p;
      case OpType::kEmbedding:
        only_first();
        return p;
      case OpType::kAttention:
        for (int d : dims)
          if (d != p) refuse(n, "pairs rows of its operands at different dims");
        if (p >= static_cast<int>(r) - 2) refuse(n, "attends across the rows");
        return p;
      default:
        refuse(n, "is an operator micro-batching does not know");
    }
  }
};

}  // namespace

Pcg split_micro_batches(Pcg pcg, int micro_batches) {
  verify(pcg, Stage::kBuilt);
  MESHFLOW_CHECK(micro_batches >= 1, "{} micro-batches", micro_batches);
  if (micro_batches == 1) return pcg;
  if (!pcg.loss) fail(ErrorKind::kInvalidArgument, "micro-batches need a loss to train");
  Tracker t{.pcg = pcg, .micro_batches = micro_batches, .batch_dim = {}};
  for (Node& n : pcg.nodes) {
    const auto id = static_cast<ValueId>(t.batch_dim.size());
    int dim = kNone;
    switch (n.kind) {
      case NodeKind::kInput:
        if (n.batch) {
          if (n.spec.shape.empty() || n.spec.shape[0] % micro_batches != 0) {
            fail(ErrorKind::kInvalidArgument,
                 "input \"{}\" of shape {} does not split into {} micro-batches along dim 0",
                 n.name, to_string(n.spec.shape), micro_batches);
          }
          n.spec.shape[0] /= micro_batches;
          n.micro_batches = micro_batches;
          dim = 0;
        }
        break;
      case NodeKind::kCompute: {
        dim = t.compute(n, pcg.loss == id);
        std::vector<TensorSpec> specs;
        for (ValueId v : n.inputs) specs.push_back(pcg.nodes[static_cast<std::size_t>(v)].spec);
        try {
          n.spec = infer(n.op, specs);
        } catch (const Error& e) {
          fail(e.kind(), "node \"{}\" in {} micro-batches: {}", n.name, micro_batches, e.what());
        }
        break;
      }
      case NodeKind::kParallel:
      case NodeKind::kMove:
        dim = t.of(n.inputs[0]);
        n.spec = pcg.nodes[static_cast<std::size_t>(n.inputs[0])].spec;
        break;
      default:
        break;
    }
    t.batch_dim.push_back(dim);
  }
  verify(pcg, Stage::kBuilt);
  return pcg;
}

}  // namespace meshflow
