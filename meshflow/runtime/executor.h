// Runs a Plan for one device over a Communicator: each step becomes collectives on the groups
// along the step's mesh dims (or one exchange for point_to_point). Uneven shards use the "v"
// collectives, so no data is padded, lost or invented.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/tensor.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

// Returns this device's shard under plan.to, given its shard `local` under plan.from. `world`
// spans every device (rank = device id). A device in neither mesh returns at once; a device
// only in one mesh passes or receives an empty tensor. Every device of both meshes must call.
// `recycled`, when its dtype and shape match the result, becomes the result's storage (so a
// loop that redistributes every step reuses one buffer instead of allocating and faulting in a
// fresh one).
Tensor execute_plan(const Plan& plan, Communicator& world, const Tensor& local,
                    Tensor recycled = Tensor());

// Plans cached by (from, to): plan_redistribute runs once per pair. Thread-safe.
class PlanCache {
 public:
  explicit PlanCache(PlanOptions options = {}) : options_(options) {}
  // Returns the plan for (from, to), planning it on first use.
  std::shared_ptr<const Plan> get(const Layout& from, const Layout& to);

 private:
  struct Key {
    Layout from, to;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      return hash_value(k.from) * 31 + hash_value(k.to);
    }
  };
  PlanOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Plan>, KeyHash> plans_;
};

}  // namespace meshflow
