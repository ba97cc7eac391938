// The pass pipeline.
#include "meshflow/graph/compile.h"

namespace meshflow {

Pcg compile(const Pcg& pcg, Mode mode, const PlanOptions& options) {
  Pcg g = infer_layouts(pcg, options);
  if (mode == Mode::kTrain) {
    g = infer_layouts(expand_backward(std::move(g)), options);
    g = infer_layouts(add_update(std::move(g)), options);
  }
  return insert_copies(std::move(g));
}

}  // namespace meshflow
