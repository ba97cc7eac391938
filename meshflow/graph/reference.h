// A model run on one device with whole tensors: sources loaded whole, compute nodes through
// ops' compute, parallel ops as the identity on values, the backward pass through
// compute_backward (the optimizer's step is train/reference_optimizer.h's). It reads the graph as
// built (Stage::kBuilt) and never touches layouts, passes, plans or the runtime: the independent
// reference `train --check` and the tests compare distributed runs with.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshflow/graph/pcg.h"

namespace meshflow {

struct ReferenceModel {
  const Pcg* pcg = nullptr;
  std::vector<Tensor> values;  // per node; sources persist, weights are updated in place
};

// Returns the model with its sources loaded.
ReferenceModel reference_load(const Pcg& pcg);

// Runs the forward pass (every non-source value).
void reference_forward(ReferenceModel& model);

// Returns the gradient of the loss for each weight the loss depends on, by name, after
// reference_forward.
std::map<std::string, Tensor> reference_gradients(const ReferenceModel& model);

}  // namespace meshflow
