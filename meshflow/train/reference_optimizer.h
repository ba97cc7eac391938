// The optimizer on whole tensors in float64, written from torch.optim's formulas
// (SGD with momentum, AdamW, clip_grad_norm_, the learning-rate schedule of train/optimizer.h)
// independently of the fused kernels: what `train --check` and the tests compare the
// distributed update with.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/train/optimizer.h"

namespace meshflow {

struct ReferenceOptimizer {
  Optimizer optimizer;
  // Per weight, its state tensors in state_names' order, as float64 values (zero at first).
  std::map<std::string, std::vector<std::vector<double>>> state;
};

// Applies step `step` (1-based) to every weight in `weights` (float32 or float64, updated in
// place, rounded to its dtype) from its gradient in `grads` (same names), after clipping by the
// global norm over all of `grads`. Returns the squared global norm; when it is not finite (or
// `loss` is not), nothing is applied.
double reference_step(ReferenceOptimizer& o, std::map<std::string, Tensor*> weights,
                      const std::map<std::string, Tensor>& grads, int step, double loss);

}  // namespace meshflow
