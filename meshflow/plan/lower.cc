// Lowering plans to device programs. For a step on mesh dims D the group is the devices along D
// through this device (rank order = row-major over D). Shard boxes under the step's `before` and
// `after` placements say what each member holds and needs; when those regions are contiguous
// blocks in rank order the plain (v-)collective is used, writing straight into the output,
// otherwise exchange_boxes moves them as n-d regions.
#include "meshflow/plan/lower.h"

#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/plan/point_to_point.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

Box relative(const Box& box, const Box& to) {
  Box out = box;
  for (std::size_t i = 0; i < out.offset.size(); ++i) out.offset[i] -= to.offset[i];
  return out;
}

// Returns true when `blocks` lie back to back in rank order and fill `outer` exactly, so a
// v-collective can use the tensor holding `outer` as its buffer directly.
bool back_to_back(const std::vector<Box>& blocks, const Box& outer) {
  std::int64_t at = 0;
  for (const Box& b : blocks) {
    if (numel(b) == 0) continue;
    auto off = contiguous_offset(b, outer);
    if (!off || *off != at) return false;
    at += numel(b);
  }
  return at == numel(outer);
}

std::vector<std::int64_t> counts_of(const std::vector<Box>& boxes) {
  std::vector<std::int64_t> c;
  for (const Box& b : boxes) c.push_back(numel(b));
  return c;
}

std::vector<Box> boxes(const Layout& l, const std::vector<DeviceId>& devices) {
  std::vector<Box> out;
  for (DeviceId d : devices) out.push_back(shard_box(l, d));
  return out;
}

// Returns the scaling `split` applies on mesh dims `dims` of `mesh` for the device at `coords`.
Scaling split_scaling(PartialSplit split, const std::vector<MeshDim>& dims, const DeviceMesh& mesh,
                      const std::vector<std::int64_t>& coords) {
  Scaling s;
  if (split == PartialSplit::kDivide) {
    s.kind = Scale::kDivide;
    for (MeshDim m : dims) s.divisor *= mesh.shape[m];
  }
  if (split == PartialSplit::kFirstKeeps) {
    for (MeshDim m : dims) {
      if (coords[m] != 0) s.kind = Scale::kZero;
    }
  }
  return s;
}

struct Lowering {
  const Layout& before;
  const Layout& after;
  DeviceId me;
};

DeviceStep lower_gather(const Lowering& c, const Step& s) {
  const std::vector<DeviceId> g = group_along(c.before.mesh, c.me, s.mesh_dims);
  const Box mine = shard_box(c.after, c.me);
  const std::vector<Box> parts = boxes(c.before, g);
  if (back_to_back(parts, mine)) return {s.kind, mine.extent, GatherCall{g, counts_of(parts)}};
  ExchangeCall x{g, shard_box(c.before, c.me).extent, mine.extent, {}, {}};
  for (const Box& part : parts) {
    x.send.push_back({full_box(x.src_shape)});
    x.recv.push_back({relative(part, mine)});
  }
  return {s.kind, mine.extent, std::move(x)};
}

DeviceStep lower_reduce_scatter(const Lowering& c, const Step& s) {
  const std::vector<DeviceId> g = group_along(c.before.mesh, c.me, s.mesh_dims);
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  const std::vector<Box> parts = boxes(c.after, g);
  ReduceScatterCall call{g, counts_of(parts), s.op, s.divisor, {}};
  if (!back_to_back(parts, mine_before)) {
    for (const Box& b : parts) call.pack.push_back(relative(b, mine_before));
  }
  return {s.kind, mine.extent, std::move(call)};
}

DeviceStep lower_all_reduce(const Lowering& c, const Step& s) {
  return {s.kind, shard_box(c.before, c.me).extent,
          AllReduceCall{group_along(c.before.mesh, c.me, s.mesh_dims), s.op, s.divisor}};
}

DeviceStep lower_all_to_all(const Lowering& c, const Step& s) {
  const std::vector<DeviceId> g = group_along(c.before.mesh, c.me, s.mesh_dims);
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  ExchangeCall x{g, mine_before.extent, mine.extent, {}, {}};
  for (DeviceId peer : g) {
    x.send.push_back({relative(intersect(mine_before, shard_box(c.after, peer)), mine_before)});
    x.recv.push_back({relative(intersect(shard_box(c.before, peer), mine), mine)});
  }
  return {s.kind, mine.extent, std::move(x)};
}

DeviceStep lower_local(const Lowering& c, const Step& s) {
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  return {s.kind, mine.extent,
          LocalCall{relative(mine, mine_before), split_scaling(s.split, s.split_dims, c.before.mesh,
                                                               coordinates(c.before.mesh, c.me))}};
}

Shape with_lead(std::int64_t first, const Shape& rest) {
  Shape v{first};
  v.insert(v.end(), rest.begin(), rest.end());
  return v;
}

Box with_lead(std::int64_t offset, std::int64_t extent, const Box& rest) {
  return Box{with_lead(offset, rest.offset), with_lead(extent, rest.extent)};
}

DeviceStep lower_point_to_point(const Plan& plan, const Step& s, DeviceId me) {
  std::vector<DeviceId> members = plan.from.mesh.devices;
  members.insert(members.end(), plan.to.mesh.devices.begin(), plan.to.mesh.devices.end());
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  auto rank_of = [&](DeviceId d) {
    return static_cast<std::size_t>(std::lower_bound(members.begin(), members.end(), d) -
                                    members.begin());
  };
  const bool in_from = find_device(plan.from.mesh, me).has_value();
  const bool in_to = find_device(plan.to.mesh, me).has_value();
  const Box src_box = in_from ? shard_box(plan.from, me) : Box{};
  const Box dst_box = in_to ? shard_box(plan.to, me) : Box{};
  // Regions carry a leading term dim: sources hold one term, destinations stage every term.
  PointToPointCall call;
  call.exchange.group = members;
  call.exchange.src_shape = in_from ? with_lead(1, src_box.extent) : Shape{};
  call.exchange.dst_shape = in_to ? with_lead(s.terms, dst_box.extent) : Shape{};
  call.exchange.send.resize(members.size());
  call.exchange.recv.resize(members.size());
  for (const Transfer& t : device_transfers(plan.from, plan.to, me)) {
    if (t.src == me)
      call.exchange.send[rank_of(t.dst)].push_back(with_lead(0, 1, relative(t.box, src_box)));
    if (t.dst == me)
      call.exchange.recv[rank_of(t.src)].push_back(with_lead(t.term, 1, relative(t.box, dst_box)));
  }
  call.terms = s.terms;
  for (MeshDim m : s.reduced_dims) {
    call.term_ops.push_back(plan.from.placements[m].op);
    call.term_sizes.push_back(plan.from.mesh.shape[m]);
  }
  if (in_to) {
    call.scaling =
        split_scaling(s.split, s.split_dims, plan.to.mesh, coordinates(plan.to.mesh, me));
  }
  return {s.kind, in_to ? dst_box.extent : Shape{0}, std::move(call)};
}

}  // namespace

DeviceProgram lower(const Plan& plan, DeviceId device) {
  DeviceProgram p;
  p.device = device;
  p.dtype = plan.from.dtype;
  p.in_from = find_device(plan.from.mesh, device).has_value();
  p.in_to = find_device(plan.to.mesh, device).has_value();
  p.in_shape = p.in_from ? local_shape(plan.from, device) : Shape{0};
  p.out_shape = p.in_to ? local_shape(plan.to, device) : Shape{0};
  if (!p.in_from && !p.in_to) return p;
  for (const Step& s : plan.steps) {
    if (s.kind == StepKind::kPointToPoint) {
      p.steps.push_back(lower_point_to_point(plan, s, device));
      continue;
    }
    MESHFLOW_CHECK(p.in_from && plan.from.mesh == plan.to.mesh,
                   "a collective step in a cross-mesh plan");
    const Layout before = with_placements(plan.from, s.before);
    const Layout after = with_placements(plan.from, s.after);
    const Lowering c{before, after, device};
    switch (s.kind) {
      case StepKind::kAllGather:
        p.steps.push_back(lower_gather(c, s));
        break;
      case StepKind::kReduceScatter:
        p.steps.push_back(lower_reduce_scatter(c, s));
        break;
      case StepKind::kAllReduce:
        p.steps.push_back(lower_all_reduce(c, s));
        break;
      case StepKind::kAllToAll:
        p.steps.push_back(lower_all_to_all(c, s));
        break;
      case StepKind::kLocal:
        p.steps.push_back(lower_local(c, s));
        break;
      case StepKind::kPointToPoint:
        break;
      case StepKind::kPermute:
      case StepKind::kBroadcast:
      case StepKind::kInPlace:
        MESHFLOW_CHECK(false, "a plan has no {} step", to_string(s.kind));
    }
  }
  const Shape& last = p.steps.empty() ? p.in_shape : p.steps.back().out_shape;
  MESHFLOW_CHECK(last == p.out_shape, "device {} ends with {} but the plan gives it {}", device,
                 to_string(last), to_string(p.out_shape));
  return p;
}

namespace {

std::string ids(const std::vector<std::int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string ids(const std::vector<DeviceId>& v) {
  return ids(std::vector<std::int64_t>(v.begin(), v.end()));
}

std::string regions(const std::vector<std::vector<Box>>& per_rank) {
  std::string out;
  for (std::size_t k = 0; k < per_rank.size(); ++k) {
    if (per_rank[k].empty()) continue;
    out += fmt::format(" {}:", k);
    for (const Box& b : per_rank[k]) out += to_string(b);
  }
  return out.empty() ? " none" : out;
}

std::string scaling_text(const Scaling& s) {
  switch (s.kind) {
    case Scale::kKeep:
      return "keep";
    case Scale::kDivide:
      return fmt::format("divide by {}", s.divisor);
    case Scale::kZero:
      return "zero";
  }
  return "?";
}

std::string call_text(const DeviceCall& call) {
  struct Text {
    std::string operator()(const GatherCall& c) const {
      return fmt::format("all_gather group {} counts {}", ids(c.group), ids(c.counts));
    }
    std::string operator()(const ExchangeCall& c) const {
      return fmt::format("exchange_boxes group {} src {} dst {}\n      send{}\n      recv{}",
                         ids(c.group), to_string(c.src_shape), to_string(c.dst_shape),
                         regions(c.send), regions(c.recv));
    }
    std::string operator()(const ReduceScatterCall& c) const {
      std::string out = fmt::format("reduce_scatter {} group {} counts {} then /{}",
                                    to_string(c.op), ids(c.group), ids(c.counts), c.divisor);
      if (!c.pack.empty()) {
        out += "\n      pack ";
        for (const Box& b : c.pack) out += to_string(b);
      }
      return out;
    }
    std::string operator()(const AllReduceCall& c) const {
      return fmt::format("all_reduce {} group {} then /{}", to_string(c.op), ids(c.group),
                         c.divisor);
    }
    std::string operator()(const LocalCall& c) const {
      return fmt::format("local keep {} then {}", to_string(c.keep), scaling_text(c.scaling));
    }
    std::string operator()(const PointToPointCall& c) const {
      std::string ops;
      for (ReduceOp op : c.term_ops) ops += (ops.empty() ? "" : ",") + std::string(to_string(op));
      return fmt::format("point_to_point {} terms (reduce [{}] sizes {}) then {}\n      {}",
                         c.terms, ops, ids(c.term_sizes), scaling_text(c.scaling),
                         (*this)(c.exchange));
    }
  };
  return std::visit(Text{}, call);
}

}  // namespace

std::string to_text(const DeviceProgram& program) {
  std::string out =
      fmt::format("device {} {}: {} -> {}", program.device, to_string(program.dtype),
                  program.in_from ? to_string(program.in_shape) : "(not a source)",
                  program.in_to ? to_string(program.out_shape) : "(not a destination)");
  out += "\n";
  for (std::size_t i = 0; i < program.steps.size(); ++i) {
    const DeviceStep& s = program.steps[i];
    out += fmt::format("  {}. {} -> {}: {}\n", i + 1, to_string(s.kind), to_string(s.out_shape),
                       call_text(s.call));
  }
  return out;
}

}  // namespace meshflow
