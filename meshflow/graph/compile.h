// The pass pipeline a model goes through before it runs, with the verifier between passes:
// (to train) split_micro_batches, infer_layouts, then (to train) expand_backward, infer_layouts,
// add_update (and at ZeRO-3 shard_weights), then expand_vocab_parallel, insert_copies, (to
// train) recompute_activations, and with `overlap` decompose_collectives. The result is
// Stage::kCopied, ready for expand_shards.
#pragma once

#include "meshflow/graph/passes.h"

namespace meshflow {

enum class Mode { kRun, kTrain };

struct CompileOptions {
  PlanOptions plan;
  // Decompose the all-gathers into and reduce-scatters out of matrix products into loops that
  // overlap each block's transfer with the product (decompose_collectives; --overlap).
  bool overlap = false;
  DecomposeOptions decompose;  // with `overlap`: the forms a decomposed all-gather may take
  UpdateRule update;           // kTrain: the optimizer every weight's update applies
  int micro_batches = 1;       // kTrain: split_micro_batches' M
  int zero = 0;                // kTrain: the ZeRO level (add_update; 3: shard_weights)
  Recompute recompute = Recompute::kNone;  // kTrain: recompute_activations' policy
  // explain's step estimate: the threads each device computes with (0: the default).
  int threads_per_device = 0;
};

// Returns the compiled graph of `pcg` (Stage::kBuilt). kTrain needs a loss.
Pcg compile(const Pcg& pcg, Mode mode, const CompileOptions& options = {});

}  // namespace meshflow
