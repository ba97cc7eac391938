// A source's values: a .npy file (the global tensor), a sharded folder (taken as it is), or a
// seeded initialiser. Initialisers follow DESIGN.md's rule, so any tool can reproduce them:
// element i (C order) draws Philox4x32-10 with key (seed, 0) and counter (i, 0, 0, 0) (the
// high 32 bits of a seed or index above 2^32 go in the second word), giving words w0, w1; with
// a = (w0 >> 8) / 2^24 and b = (w1 >> 8) / 2^24, uniform is lo + (hi - lo)·a and normal is
// std·sqrt(-2 ln(1 - a))·cos(2πb).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/graph/pcg.h"
#include "meshflow/graph/task_graph.h"

namespace meshflow {

// Throws Error(kIo or kShapeMismatch) naming the tensor and the file when the source's file is
// missing, broken, or not of the tensor's shape and dtype (a folder: not of its layout).
// Reads headers only.
void check_source(const Node& node, const Layout& layout);

// Returns `device`'s shard of source node `node` in `layout`.
Tensor load_shard(const Node& node, const Layout& layout, DeviceId device);

// Random initialisers' shards shared among the devices of one process. On the threads backend
// every replica of a weight draws the same values, element by element (Philox, then log and
// cos): for a replicated weight on 4 devices that is the same work four times, and most of a
// short run's time. With a SourceShare the first device that needs a box draws it, and the
// other devices of the process that hold the same box copy it.
//
// Invariants: a shared box is drawn once, by the device that claimed it; every taker gets a
// tensor of its own (the last taker the drawn tensor, the others copies); an entry is dropped
// when its last taker has it, so the share holds at most one extra tensor per box while the
// devices load. A draw that fails fails every taker of its box with the same error, and a
// device waits only for a box another device is drawing: none waits for a box nobody draws.
class SourceShare {
 public:
  // Counts, for every normal or uniform source of `pcg` that is not micro-batched, the devices
  // among `local` (the devices of `tasks` that load their sources in this process) that hold
  // each box of it. A box one device holds alone is not shared.
  SourceShare(const Pcg& pcg, const TaskGraph& tasks, std::span<const DeviceId> local);
  SourceShare(const SourceShare&) = delete;
  SourceShare& operator=(const SourceShare&) = delete;

  // The boxes drawn so far: one per shared box once every device has loaded.
  int drawn() const;

 private:
  friend std::vector<Tensor> load_sources(const Pcg&, const DeviceTasks&, SourceShare*);
  using Key = std::pair<ValueId, std::vector<std::int64_t>>;  // the value, its box's offset
  struct Entry {
    int takers = 0;  // the devices still to take it
    bool claimed = false, ready = false;
    Tensor tensor;
    // A failed draw: each taker throws an Error of its own made from these (an exception
    // object, or an Error's message, shared among threads would be read by one while
    // another's handler frees it).
    struct Failure {
      ErrorKind kind;
      std::string message;
      ErrorScope scope;
    };
    std::optional<Failure> failure;
  };
  using Entries = std::map<Key, Entry>;

  // Returns the entry of `device`'s box of source `v`, or end() when it is not shared.
  Entries::iterator find(const Pcg& pcg, ValueId v, DeviceId device);
  // Returns the ready entry's tensor: a copy, or the tensor itself to its last taker, who drops
  // the entry. Throws a failed draw's error (an Error of its own). Called with `mu_` held.
  Tensor take(Entries::iterator it);

  mutable std::mutex mu_;
  std::condition_variable ready_;
  Entries entries_;
  int drawn_ = 0;
};

// Returns a value table for `pcg` (one empty tensor per node) holding `tasks.device`'s shards
// of the sources it lists: what run_tasks starts from. With `share`, the device draws the
// shared boxes no other device has claimed and copies the ones another device drew; a box
// another device is still drawing is taken last, after the device's other sources.
std::vector<Tensor> load_sources(const Pcg& pcg, const DeviceTasks& tasks,
                                 SourceShare* share = nullptr);

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
