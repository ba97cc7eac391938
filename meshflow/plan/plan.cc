// Plan text and JSON forms.
#include "meshflow/plan/plan.h"

#include <fmt/format.h>

#include <set>

namespace meshflow {

std::string_view to_string(StepKind kind) {
  switch (kind) {
    case StepKind::kAllGather:
      return "all_gather";
    case StepKind::kAllReduce:
      return "all_reduce";
    case StepKind::kReduceScatter:
      return "reduce_scatter";
    case StepKind::kAllToAll:
      return "all_to_all";
    case StepKind::kPointToPoint:
      return "point_to_point";
    case StepKind::kLocal:
      return "local";
    case StepKind::kPermute:
      return "permute";
    case StepKind::kBroadcast:
      return "broadcast";
    case StepKind::kInPlace:
      return "in_place";
  }
  return "?";
}

std::string_view to_string(PartialSplit split) {
  switch (split) {
    case PartialSplit::kNone:
      return "none";
    case PartialSplit::kDivide:
      return "divide";
    case PartialSplit::kFirstKeeps:
      return "first_keeps";
  }
  return "?";
}

std::vector<DeviceId> plan_devices(const Plan& plan) {
  std::set<DeviceId> ids(plan.from.mesh.devices.begin(), plan.from.mesh.devices.end());
  ids.insert(plan.to.mesh.devices.begin(), plan.to.mesh.devices.end());
  return {ids.begin(), ids.end()};
}

std::vector<DeviceId> step_devices(const Plan& plan, const Step& step) {
  // A point-to-point exchange is one call over both meshes' devices (plan/lower.cc).
  return step.kind == StepKind::kPointToPoint ? plan_devices(plan) : plan.from.mesh.devices;
}

namespace {

std::string dims_text(const std::vector<MeshDim>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string seconds(double s) { return fmt::format("{:.3g} us", s * 1e6); }

// Returns "reduce sum over mesh_dims [0,2] then /4", or for ops that do not reduce together
// "reduce max(sum) over mesh_dims [0,2], innermost first".
std::string reduction_text(const Plan& plan, const Step& s) {
  std::vector<ReduceOp> ops;
  std::vector<std::int64_t> sizes;
  for (MeshDim m : s.reduced_dims) {
    ops.push_back(plan.from.placements[m].op);
    sizes.push_back(plan.from.mesh.shape[m]);
  }
  if (flat_reduction(ops, sizes)) {
    return fmt::format("reduce {} over mesh_dims {}{}", to_string(s.op), dims_text(s.reduced_dims),
                       s.divisor != 1 ? fmt::format(" then /{}", s.divisor) : "");
  }
  std::string nested;
  for (std::size_t i = ops.size(); i-- > 0;)
    nested = i + 1 == ops.size() ? std::string(to_string(ops[i]))
                                 : fmt::format("{}({})", to_string(ops[i]), nested);
  return fmt::format("reduce {} over mesh_dims {}, innermost first", nested,
                     dims_text(s.reduced_dims));
}

}  // namespace

std::string to_text(const Plan& plan) {
  std::string out = fmt::format("plan {} {} on {}: {} -> {}", to_string(plan.from.shape),
                                to_string(plan.from.dtype), to_string(plan.from.mesh),
                                to_string(plan.from.placements), to_string(plan.to.placements));
  if (!(plan.to.mesh == plan.from.mesh)) out += fmt::format(" on {}", to_string(plan.to.mesh));
  out +=
      fmt::format("\nplanner {}: {} steps, est {}, moves {} bytes (lower bound {})\n", plan.planner,
                  plan.steps.size(), seconds(plan.est_s), plan.total_bytes, plan.min_bytes);
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    out += fmt::format("  {}. {}", i + 1, to_string(s.kind));
    if (s.kind == StepKind::kPointToPoint) {
      out += fmt::format(" {} transfers, {} terms", s.transfers, s.terms);
    } else {
      std::int64_t group = 1;
      for (MeshDim m : s.mesh_dims) group *= plan.from.mesh.shape[m];
      out += fmt::format(" mesh_dims {} (groups of {}) {} -> {}", dims_text(s.mesh_dims), group,
                         to_string(s.before), to_string(s.after));
    }
    if (!s.reduced_dims.empty()) out += ", " + reduction_text(plan, s);
    if (s.split != PartialSplit::kNone)
      out += fmt::format(", split {} on mesh_dims {}", to_string(s.split), dims_text(s.split_dims));
    out += fmt::format(", {} bytes/device, {} total, est {}\n", s.bytes_per_device, s.total_bytes,
                       seconds(s.est_s));
  }
  for (const Alternative& a : plan.alternatives) {
    out += fmt::format("  alternative {}: {} steps, est {}, moves {} bytes\n", a.planner, a.steps,
                       seconds(a.est_s), a.total_bytes);
  }
  return out;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json steps = nlohmann::json::array();
  const bool list_devices =
      size(plan.from.mesh) <= kPlanJsonMaxDevices && size(plan.to.mesh) <= kPlanJsonMaxDevices;
  for (const Step& s : plan.steps) {
    std::vector<std::int64_t> group_shape;
    for (MeshDim m : s.mesh_dims) group_shape.push_back(plan.from.mesh.shape[m]);
    steps.push_back({{"kind", to_string(s.kind)},
                     {"mesh_dims", s.mesh_dims},
                     {"group_shape", group_shape},
                     {"devices", list_devices ? nlohmann::json(step_devices(plan, s))
                                              : nlohmann::json(nullptr)},
                     {"before", to_string(s.before)},
                     {"after", to_string(s.after)},
                     {"reduced_dims", s.reduced_dims},
                     {"op", to_string(s.op)},
                     {"divisor", s.divisor},
                     {"split_dims", s.split_dims},
                     {"split", to_string(s.split)},
                     {"bytes_per_device", s.bytes_per_device},
                     {"total_bytes", s.total_bytes},
                     {"est_s", s.est_s}});
  }
  nlohmann::json alternatives = nlohmann::json::array();
  for (const Alternative& a : plan.alternatives) {
    alternatives.push_back({{"planner", a.planner},
                            {"est_s", a.est_s},
                            {"total_bytes", a.total_bytes},
                            {"steps", a.steps}});
  }
  return {{"planner", plan.planner},         {"est_s", plan.est_s}, {"min_bytes", plan.min_bytes},
          {"total_bytes", plan.total_bytes}, {"steps", steps},      {"alternatives", alternatives}};
}

}  // namespace meshflow
