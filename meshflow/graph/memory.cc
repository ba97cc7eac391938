// The memory accounting and the task graph walk that estimates it.
#include "meshflow/graph/memory.h"

#include <algorithm>
#include <numeric>

namespace meshflow {

std::int64_t MemoryBreakdown::total() const {
  return std::accumulate(bytes.begin(), bytes.end(), std::int64_t{0});
}

nlohmann::json to_json(const MemoryBreakdown& m) {
  return {{"weights", m.bytes[0]},     {"gradients", m.bytes[1]}, {"optimizer_state", m.bytes[2]},
          {"activations", m.bytes[3]}, {"gathered", m.bytes[4]},  {"snapshot", m.bytes[5]}};
}

std::vector<MemoryKind> memory_kinds(const Pcg& pcg) {
  std::vector<MemoryKind> kinds;
  for (const Node& n : pcg.nodes) {
    // ZeRO-1's chunk of a weight for its update and the weight all-gathered from it are weights.
    const bool chunk = n.kind == NodeKind::kMove && n.phase == Phase::kUpdate &&
                       pcg.nodes[static_cast<std::size_t>(n.inputs[0])].kind == NodeKind::kWeight;
    if (n.kind == NodeKind::kWeight || n.replaces || chunk) {
      kinds.push_back(MemoryKind::kWeights);
    } else if (n.zero_gather) {
      kinds.push_back(MemoryKind::kGathered);
    } else if (n.recomputes) {
      kinds.push_back(MemoryKind::kActivations);
    } else if (n.kind == NodeKind::kState) {
      kinds.push_back(MemoryKind::kOptimizerState);
    } else if (n.phase != Phase::kForward) {
      kinds.push_back(MemoryKind::kGradients);
    } else {
      kinds.push_back(MemoryKind::kActivations);
    }
  }
  return kinds;
}

void MemoryCounter::observe(const std::vector<std::int64_t>& bytes, const MemoryBreakdown& extra) {
  MemoryBreakdown now = extra;
  for (std::size_t v = 0; v < bytes.size(); ++v) now[(*kinds_)[v]] += bytes[v];
  if (now.total() > result_.peak) {
    result_.peak = now.total();
    result_.at_peak = now;
  }
}

std::vector<DeviceMemory> estimate_memory(const Pcg& pcg, const TaskGraph& g, int micro_batches) {
  const std::vector<MemoryKind> kinds = memory_kinds(pcg);
  auto kind = [&](ValueId v) { return kinds[static_cast<std::size_t>(v)]; };
  std::vector<DeviceMemory> out;
  for (const DeviceTasks& dt : g.devices) {
    const DeviceId d = dt.device;
    std::vector<std::int64_t> bytes(g.layouts.size(), 0);
    // The bytes held per kind, kept as values change (a sum over every value per task would
    // make the walk quadratic in the graph).
    MemoryBreakdown held;
    auto set = [&](ValueId v, std::int64_t b) {
      std::int64_t& now = bytes[static_cast<std::size_t>(v)];
      held[kind(v)] += b - now;
      now = b;
    };
    DeviceMemory result;
    MemoryBreakdown waiting;  // a micro-batched input's other micro-batches
    for (ValueId v : dt.sources) {
      set(v, shard_bytes(g, v, d));
      const int mb = pcg.nodes[static_cast<std::size_t>(v)].micro_batches;
      if (mb > 1) waiting[kind(v)] += (mb - 1) * shard_bytes(g, v, d);
    }
    std::vector<bool> accumulated(g.layouts.size(), false);
    for (ValueId v : dt.accumulated) accumulated[static_cast<std::size_t>(v)] = true;
    MemoryBreakdown extra = waiting;
    auto observe = [&] {
      MemoryBreakdown now = extra;
      for (std::size_t k = 0; k < now.bytes.size(); ++k) now.bytes[k] += held.bytes[k];
      if (now.total() > result.peak) {
        result.peak = now.total();
        result.at_peak = now;
      }
    };
    auto run = [&](TaskPart part) {
      for (const Task& t : dt.tasks) {
        if (part != TaskPart::kAll && t.once_per_step != (part == TaskPart::kOncePerStep)) continue;
        for (ValueId v : values_made(t)) set(v, shard_bytes(g, v, d));
        if (t.reuses_input) set(task_reads(t)[0], 0);  // the result is the input's buffer
        observe();
        for (ValueId v : t.release)
          if (part != TaskPart::kMicroBatch || !accumulated[static_cast<std::size_t>(v)]) set(v, 0);
      }
    };
    observe();
    if (micro_batches == 1) {
      run(TaskPart::kAll);
    } else {
      // The first micro-batch's accumulated values become the sums; later ones are added in
      // and stay beside them until the next micro-batch remakes them, except those a task adds
      // into in its kernel (Task::accumulates): the sum is that value while its micro-batch runs.
      const std::vector<bool> in_place = accumulated_in_place(dt);
      MemoryBreakdown sums;
      auto set_extra = [&] {
        for (std::size_t k = 0; k < extra.bytes.size(); ++k)
          extra.bytes[k] = waiting.bytes[k] + sums.bytes[k];
      };
      for (int m = 0; m < micro_batches; ++m) {
        for (std::size_t i = 0; i < dt.accumulated.size(); ++i) {
          if (m == 0 || !in_place[i]) continue;
          const ValueId v = dt.accumulated[i];
          set(v, shard_bytes(g, v, d));
          sums[kind(v)] -= bytes[static_cast<std::size_t>(v)];
        }
        set_extra();
        run(TaskPart::kMicroBatch);
        for (std::size_t i = 0; i < dt.accumulated.size(); ++i) {
          if (m > 0 && !in_place[i]) continue;
          const ValueId v = dt.accumulated[i];
          sums[kind(v)] += bytes[static_cast<std::size_t>(v)];
          set(v, 0);
        }
        set_extra();
      }
      // The sums become the values (the last micro-batch's are dropped).
      for (ValueId v : dt.accumulated) set(v, shard_bytes(g, v, d));
      extra = waiting;
      run(TaskPart::kOncePerStep);
    }
    result.device = d;
    out.push_back(result);
  }
  return out;
}

}  // namespace meshflow
