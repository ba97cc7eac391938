// The pass pipeline a model goes through before it runs, with the verifier between passes:
// infer_layouts, then (to train) expand_backward, infer_layouts, add_update, infer_layouts,
// then insert_copies. The result is Stage::kCopied, ready for expand_shards.
#pragma once

#include "meshflow/graph/passes.h"

namespace meshflow {

enum class Mode { kRun, kTrain };

// Returns the compiled graph of `pcg` (Stage::kBuilt). kTrain needs a loss.
Pcg compile(const Pcg& pcg, Mode mode, const PlanOptions& options = {});

}  // namespace meshflow
