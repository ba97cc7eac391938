// Memory of a training step per device (DESIGN's "Estimates"): what each value is (weights,
// gradients, optimizer state, activations, gathered weights), one accounting of the tensors a
// device holds at a time, the estimate that walks a task graph in the runtime's order with
// each shard's size, and the count the runtime makes of the tensors it really holds.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "meshflow/graph/task_graph.h"

namespace meshflow {

// kSnapshot: a checkpoint's copy of a device's shards, held while it is written in the
// background (train/checkpoint.h's CheckpointWriter), beside the step's values.
enum class MemoryKind { kWeights, kGradients, kOptimizerState, kActivations, kGathered, kSnapshot };

// Bytes per kind; the kinds sum to the total.
struct MemoryBreakdown {
  std::array<std::int64_t, 6> bytes{};
  std::int64_t total() const;
  std::int64_t& operator[](MemoryKind k) { return bytes[static_cast<std::size_t>(k)]; }
  std::int64_t operator[](MemoryKind k) const { return bytes[static_cast<std::size_t>(k)]; }
  bool operator==(const MemoryBreakdown&) const = default;
};

// Returns {"weights", "gradients", "optimizer_state", "activations", "gathered", "snapshot"}.
nlohmann::json to_json(const MemoryBreakdown& m);

// Returns what each value of `pcg` is: kWeight sources, ZeRO-1's chunks of them and their
// all-gathers are weights; kState sources optimizer state; ZeRO-3's gathers of a weight for one
// use (Node::zero_gather) gathered; every other value of the backward and update passes (the
// gradients of weights and of activations, the gradient norm) a gradient; inputs and the other
// forward values, and their recomputations in backward (Node::recomputes), activations.
std::vector<MemoryKind> memory_kinds(const Pcg& pcg);

// A device's peak of held bytes and what they were at that moment.
struct DeviceMemory {
  DeviceId device = 0;
  std::int64_t peak = 0;
  MemoryBreakdown at_peak;
};

// Counts the bytes a device holds as a step runs: observe() after every task with the bytes
// of every value (and of what the runtime holds beside them: micro-batches waiting, sums).
class MemoryCounter {
 public:
  explicit MemoryCounter(const std::vector<MemoryKind>* kinds) : kinds_(kinds) {}
  // `bytes[v]`: value v's bytes now; `extra`: bytes held beside the values.
  void observe(const std::vector<std::int64_t>& bytes, const MemoryBreakdown& extra);
  const DeviceMemory& result() const { return result_; }
  DeviceMemory& result() { return result_; }
  const std::vector<MemoryKind>& kinds() const { return *kinds_; }

 private:
  const std::vector<MemoryKind>* kinds_;
  DeviceMemory result_;
};

// Returns each device's peak over one step of `micro_batches` micro-batches of task graph `g`
// (of compiled graph `pcg`), walking its tasks in the runtime's order with each value's shard
// size: sources held throughout (a micro-batched input's every micro-batch), a task's value
// added when it runs (a move's only on its destination), released values dropped, and with
// M > 1 the accumulated values' sums beside the values each micro-batch makes.
std::vector<DeviceMemory> estimate_memory(const Pcg& pcg, const TaskGraph& g, int micro_batches);

}  // namespace meshflow
