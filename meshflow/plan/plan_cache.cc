#include "meshflow/plan/plan_cache.h"

namespace meshflow {

std::shared_ptr<const Plan> PlanCache::get(const Layout& from, const Layout& to) {
  Key key{from, to};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second.plan;
  }
  auto plan = std::make_shared<const Plan>(plan_redistribute(from, to, options_));
  std::lock_guard lock(mu_);
  Entry& e = entries_[std::move(key)];
  if (!e.plan) e.plan = std::move(plan);
  return e.plan;
}

std::shared_ptr<const DeviceProgram> PlanCache::program(const Layout& from, const Layout& to,
                                                        DeviceId device) {
  std::shared_ptr<const Plan> plan = get(from, to);
  {
    std::lock_guard lock(mu_);
    auto& programs = entries_.at(Key{from, to}).programs;
    auto it = programs.find(device);
    if (it != programs.end()) return it->second;
  }
  auto program = std::make_shared<const DeviceProgram>(lower(*plan, device));
  std::lock_guard lock(mu_);
  return entries_.at(Key{from, to}).programs.emplace(device, std::move(program)).first->second;
}

std::vector<std::pair<DeviceId, std::shared_ptr<const DeviceProgram>>> PlanCache::programs(
    const Layout& from, const Layout& to) {
  std::shared_ptr<const Plan> plan = get(from, to);
  std::vector<std::pair<DeviceId, std::shared_ptr<const DeviceProgram>>> out;
  std::lock_guard lock(mu_);
  auto& cached = entries_.at(Key{from, to}).programs;
  for (DeviceId d : plan_devices(*plan)) {
    auto& program = cached[d];
    if (!program) program = std::make_shared<const DeviceProgram>(lower(*plan, d));
    out.emplace_back(d, program);
  }
  return out;
}

}  // namespace meshflow
