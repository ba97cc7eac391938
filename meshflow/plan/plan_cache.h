// Plans and device programs cached by (from, to): plan_redistribute runs once per pair and lower
// once per (pair, device). Shared by the eager DTensor path, shard expansion and explain.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshflow/plan/lower.h"
#include "meshflow/plan/planner.h"

namespace meshflow {

// Plans and programs cached by (from, to): plan_redistribute runs once per pair and lower once
// per (pair, device). Thread-safe.
class PlanCache {
 public:
  explicit PlanCache(PlanOptions options = {}) : options_(options) {}
  // Returns the plan for (from, to), planning it on first use.
  std::shared_ptr<const Plan> get(const Layout& from, const Layout& to);
  // Returns `device`'s program for (from, to), lowering it on first use.
  std::shared_ptr<const DeviceProgram> program(const Layout& from, const Layout& to,
                                               DeviceId device);
  // Returns every device's program for (from, to), in plan_devices order (shard expansion
  // takes them all at once: one lookup per move instead of one per device).
  std::vector<std::pair<DeviceId, std::shared_ptr<const DeviceProgram>>> programs(
      const Layout& from, const Layout& to);

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
  struct Entry {
    std::shared_ptr<const Plan> plan;
    std::unordered_map<DeviceId, std::shared_ptr<const DeviceProgram>> programs;
  };
  PlanOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace meshflow
