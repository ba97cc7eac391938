// The pass pipeline.
#include "meshflow/graph/compile.h"

namespace meshflow {

Pcg compile(const Pcg& pcg, Mode mode, const CompileOptions& options) {
  Pcg g = fold_transposes(pcg);
  if (mode == Mode::kTrain) g = split_micro_batches(std::move(g), options.micro_batches);
  g = infer_layouts(std::move(g), options.plan);
  if (mode == Mode::kTrain) {
    g = infer_layouts(expand_backward(std::move(g)), options.plan);
    g = add_update(std::move(g), options.update, options.zero);
    if (options.zero == 3) g = shard_weights(std::move(g));
  }
  g = insert_copies(expand_vocab_parallel(std::move(g), options.plan));
  if (mode == Mode::kTrain) g = recompute_activations(std::move(g), options.recompute);
  return options.overlap ? decompose_collectives(std::move(g), options.plan, options.decompose) : g;
}

}  // namespace meshflow
