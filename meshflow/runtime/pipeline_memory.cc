// The memory estimate of a pipelined step: run_pipeline_step's order and accounting, walked
// with each value's shard size instead of run.
#include <algorithm>
#include <map>

#include "meshflow/runtime/pipeline.h"

namespace meshflow {

std::vector<DeviceMemory> estimate_pipeline_memory(const Pcg& pcg, const TaskGraph& g,
                                                   const std::vector<DevicePipeline>& pipelines,
                                                   int micro_batches) {
  const std::vector<MemoryKind> kinds = memory_kinds(pcg);
  const auto M = static_cast<std::size_t>(micro_batches);
  std::vector<DeviceMemory> out;
  for (std::size_t di = 0; di < g.devices.size(); ++di) {
    const DevicePipeline& p = pipelines[di];
    const DeviceTasks& dt = p.stage >= 0 ? p.tasks : g.devices[di];
    const DeviceId d = dt.device;
    auto size = [&](ValueId v) { return shard_bytes(g, v, d); };
    auto kind = [&](ValueId v) { return kinds[static_cast<std::size_t>(v)]; };
    DeviceMemory result{.device = d};
    // What the device holds, per kind, kept as values change.
    MemoryBreakdown held;
    // set[m][v]: the bytes micro-batch m's value v holds.
    std::vector<std::map<ValueId, std::int64_t>> set(M);
    auto put = [&](std::size_t m, ValueId v, std::int64_t b) {
      std::int64_t& now = set[m][v];
      held[kind(v)] += b - now;
      now = b;
    };
    // Sources; a micro-batched input's micro-batches wait in their sets until each set is done.
    for (ValueId v : dt.sources) {
      if (pcg.nodes[static_cast<std::size_t>(v)].micro_batches > 1 && p.stage >= 0) {
        for (std::size_t m = 0; m < M; ++m) put(m, v, size(v));
      } else {
        held[kind(v)] += size(v);
      }
    }
    auto observe = [&] {
      if (held.total() > result.peak) {
        result.peak = held.total();
        result.at_peak = held;
      }
    };
    observe();
    std::vector<bool> accumulated(g.layouts.size(), false);
    for (ValueId v : dt.accumulated) accumulated[static_cast<std::size_t>(v)] = true;
    const std::vector<bool> in_place = accumulated_in_place(dt);
    std::map<ValueId, bool> adds_in_place;
    for (std::size_t i = 0; i < dt.accumulated.size(); ++i)
      adds_in_place[dt.accumulated[i]] = in_place[i];
    std::map<ValueId, bool> summed;  // accumulated value -> its sum exists
    if (p.stage >= 0) {
      std::vector<std::size_t> last_group(M, 0);
      for (std::size_t k = 0; k < p.order.size(); ++k)
        last_group[static_cast<std::size_t>(p.order[k].micro_batch)] = k;
      for (std::size_t k = 0; k < p.order.size(); ++k) {
        const ScheduledGroup& grp = p.order[k];
        const auto m = static_cast<std::size_t>(grp.micro_batch);
        const std::vector<int>& group = group_tasks(p, grp.kind);
        std::vector<ValueId> made_sums;  // accumulated values this group makes
        for (int ti : group) {
          const Task& t = dt.tasks[static_cast<std::size_t>(ti)];
          for (ValueId v : values_made(t)) {
            if (!accumulated[static_cast<std::size_t>(v)]) {
              put(m, v, size(v));
              continue;
            }
            made_sums.push_back(v);
            // A kernel adding into the sum makes nothing new; else the value waits beside it.
            if (!(adds_in_place[v] && summed[v])) held[kind(v)] += size(v);
          }
          if (t.reuses_input) put(m, task_reads(t)[0], 0);
          observe();
          for (ValueId v : t.release)
            if (!accumulated[static_cast<std::size_t>(v)]) put(m, v, 0);
        }
        for (ValueId v : made_sums) {  // the first makes the sum; later ones are added to it
          if (summed[v] && !adds_in_place[v]) held[kind(v)] -= size(v);
          summed[v] = true;
        }
        if (k == last_group[m])
          for (auto& [v, b] : set[m]) put(m, v, 0);
      }
    }
    // The once-per-step tasks, the sums being the accumulated values.
    std::vector<std::int64_t> bytes(g.layouts.size(), 0);
    for (ValueId v : dt.accumulated)
      if (summed[v]) bytes[static_cast<std::size_t>(v)] = size(v);
    for (const Task& t : dt.tasks) {
      if (!t.once_per_step) continue;
      for (ValueId v : values_made(t)) {
        held[kind(v)] += size(v) - bytes[static_cast<std::size_t>(v)];
        bytes[static_cast<std::size_t>(v)] = size(v);
      }
      observe();
      for (ValueId v : t.release) {
        held[kind(v)] -= bytes[static_cast<std::size_t>(v)];
        bytes[static_cast<std::size_t>(v)] = 0;
      }
    }
    out.push_back(result);
  }
  return out;
}

}  // namespace meshflow
