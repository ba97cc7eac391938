// A source's values: a .npy file (the global tensor), a sharded folder (taken as it is), or a
// seeded initialiser. Initialisers follow DESIGN.md's rule, so any tool can reproduce them:
// element i (C order) draws Philox4x32-10 with key (seed, 0) and counter (i, 0, 0, 0) (the
// high 32 bits of a seed or index above 2^32 go in the second word), giving words w0, w1; with
// a = (w0 >> 8) / 2^24 and b = (w1 >> 8) / 2^24, uniform is lo + (hi - lo)·a and normal is
// std·sqrt(-2 ln(1 - a))·cos(2πb).
#pragma once

#include <filesystem>

#include "meshflow/graph/pcg.h"
#include "meshflow/graph/task_graph.h"

namespace meshflow {

// Throws Error(kIo or kShapeMismatch) naming the tensor and the file when the source's file is
// missing, broken, or not of the tensor's shape and dtype (a folder: not of its layout).
// Reads headers only.
void check_source(const Node& node, const Layout& layout);

// Returns `device`'s shard of source node `node` in `layout`.
Tensor load_shard(const Node& node, const Layout& layout, DeviceId device);

// Returns a value table for `pcg` (one empty tensor per node) holding `tasks.device`'s shards
// of the sources it lists: what run_tasks starts from.
std::vector<Tensor> load_sources(const Pcg& pcg, const DeviceTasks& tasks);

// Returns the whole tensor (a folder's Partial terms reduced); for a micro-batched input
// (Node::micro_batches > 1), the whole source, all micro-batches.
Tensor load_global(const Node& node);

// Returns `device`'s shard in `layout` (the micro-batch's) of micro-batch `m` of micro-batched
// input `node`: rows [m·R, (m+1)·R) of the source, R the layout's dim 0.
Tensor load_micro_batch(const Node& node, const Layout& layout, DeviceId device, int m);

// Returns, per value of `pcg`, the device's shards of every micro-batch of each micro-batched
// input among `tasks.sources` (empty for every other value): what the runtime swaps in before
// each micro-batch.
std::vector<std::vector<Tensor>> load_micro_batches(const Pcg& pcg, const DeviceTasks& tasks);

}  // namespace meshflow
