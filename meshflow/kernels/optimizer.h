// The optimizers' update rules (PyTorch's torch.optim forms) as fused loops over one shard: one
// pass reads the weight, its gradient and its state and writes the weight and the state in
// place, with no temporary of the shard's size. Plain CPU arithmetic over tensors: no mesh, no
// graph. The gradient's global squared norm (for clipping and the non-finite check) is a sum of
// per-shard sums of squares, each from sum_of_squares.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/core/tensor.h"

namespace meshflow {

enum class OptimizerKind { kSgd, kAdamW };

// Returns "sgd" or "adamw"; parses them.
std::string_view to_string(OptimizerKind kind);
std::optional<OptimizerKind> parse_optimizer_kind(std::string_view text);

// An optimizer's hyperparameters that stay fixed over a run: what every weight's update node
// carries. The learning rate, the step number and the clipping coefficient change from step to
// step (StepScalars).
struct UpdateRule {
  OptimizerKind kind = OptimizerKind::kSgd;
  double momentum = 0;                     // sgd: 0 keeps no state
  double beta1 = 0.9, beta2 = 0.999;       // adamw
  double eps = 1e-8, weight_decay = 0.01;  // adamw (decoupled decay: w *= 1 - lr * wd)
  // Every gradient is first scaled by min(1, clip / (‖g‖ + 1e-6)), ‖g‖ the L2 norm over all
  // weights' gradients together (torch.nn.utils.clip_grad_norm_); none: no clipping. The
  // caller computes that coefficient (StepScalars::grad_scale).
  std::optional<double> clip_grad_norm;
  bool operator==(const UpdateRule&) const = default;
};

// Returns the names of the state tensors one weight has under `rule`, in the order update_shard
// takes them: sgd with momentum: {"momentum_buffer"}; sgd without: {}; adamw: {"exp_avg",
// "exp_avg_sq"} (torch.optim's state keys).
std::vector<std::string> state_names(const UpdateRule& rule);

// What changes from step to step.
struct StepScalars {
  double lr = 0;
  int step = 1;           // t, 1-based over the whole run (adamw's bias corrections)
  double grad_scale = 1;  // the clipping coefficient the gradient is multiplied by
};

// Applies one step of `rule` to a shard, in place on `weight` and `state` (state_names' order,
// each of the weight's shape and dtype, zero before the first step), reading `grad` (not
// modified) scaled by s.grad_scale:
//   sgd:   buf = momentum·buf + g (momentum > 0; buf = g at the first step since buf starts at
//          0), w -= lr·buf; without momentum w -= lr·g.
//   adamw: w *= 1 − lr·wd; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
//          w −= (lr / (1−β1^t)) · m / (√v / √(1−β2^t) + eps).
// The per-step coefficients are computed once in double; the elements in the weight's dtype.
void update_shard(const UpdateRule& rule, const StepScalars& s, Tensor& weight, const Tensor& grad,
                  std::span<Tensor* const> state);

// Returns the coefficient clipping multiplies every gradient by, given the squared global norm
// and the rule's clip_grad_norm: min(1, clip / (√norm_sq + 1e-6)); 1 without clipping.
double clip_coefficient(const UpdateRule& rule, double norm_sq);

// Returns the sum of the squares of `t`'s elements [first, last) (floating point), accumulated
// in double: non-finite when any of them is.
double sum_of_squares(const Tensor& t, std::int64_t first, std::int64_t last);
// ... of all of them.
double sum_of_squares(const Tensor& t);

}  // namespace meshflow
