// Step execution. For a step on mesh dims D the group is the devices along D through this
// device (rank order = row-major over D). Shard boxes under the step's `before` and `after`
// placements say what each member holds and needs; when those regions are contiguous slabs in
// rank order the collective writes straight into the result, otherwise exchange_boxes moves
// them as n-d regions (still one copy per byte on shared memory).
#include "meshflow/runtime/executor.h"

#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/plan/point_to_point.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

std::vector<std::int64_t> relative(const Box& box, const Box& to) {
  std::vector<std::int64_t> out(box.offset.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = box.offset[i] - to.offset[i];
  return out;
}

// Returns the flat element offset of `inner` in a row-major tensor holding `outer`, when
// `inner` is one contiguous run there (or empty); nullopt otherwise.
std::optional<std::int64_t> contiguous_offset(const Box& inner, const Box& outer) {
  if (numel(inner) == 0) return std::nullopt;
  const std::size_t rank = inner.extent.size();
  std::size_t j = 0;  // first dim where inner does not have extent 1
  while (j < rank && inner.extent[j] == 1) ++j;
  for (std::size_t k = j + 1; k < rank; ++k) {
    if (inner.extent[k] != outer.extent[k]) return std::nullopt;
  }
  std::int64_t flat = 0;
  const auto strides = row_major_strides(outer.extent);
  for (std::size_t k = 0; k < rank; ++k) flat += (inner.offset[k] - outer.offset[k]) * strides[k];
  return flat;
}

// Returns true when `blocks` (relative to `outer`) lie back to back in rank order, so a v
// collective can use the tensor holding `outer` as its buffer directly.
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

struct StepContext {
  const Layout& before;
  const Layout& after;
  Communicator& world;
  DeviceId me;
  Tensor* recycled;  // the final step's output storage, when it fits
};

// Returns storage for a step's result: the recycled tensor if it fits, else a fresh one. Every
// element is written by the step.
Tensor output(const StepContext& c, DType dtype, const Shape& shape) {
  if (c.recycled && c.recycled->dtype() == dtype && c.recycled->shape() == shape)
    return std::move(*c.recycled);
  return Tensor::uninitialized(dtype, shape);
}

std::shared_ptr<Communicator> group_of(const StepContext& c, const std::vector<MeshDim>& dims) {
  return c.world.group(group_along(c.before.mesh, c.me, dims));
}

std::vector<Box> boxes(const Layout& l, const std::vector<DeviceId>& devices) {
  std::vector<Box> out;
  for (DeviceId d : devices) out.push_back(shard_box(l, d));
  return out;
}

Tensor run_all_gather(const StepContext& c, const Step& s, const Tensor& local) {
  auto g = group_of(c, s.mesh_dims);
  const Box mine = shard_box(c.after, c.me);
  const std::vector<Box> parts = boxes(c.before, g->devices());
  Tensor out = output(c, local.dtype(), mine.extent);
  if (back_to_back(parts, mine)) {
    all_gather(*g, {.send = local.bytes(),
                    .recv = out.bytes(),
                    .recv_counts = counts_of(parts),
                    .dtype = local.dtype()});
    return out;
  }
  ExchangeBoxesOptions o{.src = local.bytes(),
                         .src_shape = local.shape(),
                         .dst = out.bytes(),
                         .dst_shape = out.shape(),
                         .dtype = local.dtype()};
  for (std::size_t k = 0; k < parts.size(); ++k) {
    o.send.push_back({full_box(local.shape())});
    o.recv.push_back({Box{relative(parts[k], mine), parts[k].extent}});
  }
  exchange_boxes(*g, o);
  return out;
}

// Returns the communicator op for reducing Partial dims `dims` of `before` together, and the
// divisor applied afterwards. The move is valid (transitions.h), so the ops reduce together.
FlatReduction reduction(const Layout& before, const std::vector<MeshDim>& dims) {
  std::vector<ReduceOp> ops;
  std::vector<std::int64_t> sizes;
  for (MeshDim m : dims) {
    ops.push_back(before.placements[m].op);
    sizes.push_back(before.mesh.shape[m]);
  }
  auto flat = flat_reduction(ops, sizes);
  MESHFLOW_CHECK(flat.has_value(), "mesh dims with incompatible Partial ops in one step");
  return *flat;
}

Tensor run_reduce_scatter(const StepContext& c, const Step& s, const Tensor& local) {
  auto g = group_of(c, s.mesh_dims);
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  const std::vector<Box> parts = boxes(c.after, g->devices());
  const auto [op, divisor] = reduction(c.before, s.mesh_dims);
  Tensor out = output(c, local.dtype(), mine.extent);
  const std::byte* send = local.bytes();
  Tensor packed;
  if (!back_to_back(parts, mine_before)) {
    std::int64_t total = 0;
    for (const Box& b : parts) total += numel(b);
    packed = Tensor::uninitialized(local.dtype(), {total});
    std::int64_t at = 0;
    const std::size_t es = size_of(local.dtype());
    for (const Box& b : parts) {
      Shape ext = b.extent;
      copy_box(ConstBuffer{local.bytes(), &local.shape(), es}, relative(b, mine_before),
               MutableBuffer{packed.bytes() + at * es, &ext, es},
               std::vector<std::int64_t>(ext.size(), 0), b.extent);
      at += numel(b);
    }
    send = packed.bytes();
  }
  reduce_scatter(*g, {.send = send,
                      .recv = out.bytes(),
                      .recv_counts = counts_of(parts),
                      .dtype = local.dtype(),
                      .op = op});
  divide_by(out.dtype(), out.bytes(), out.numel(), divisor);
  return out;
}

Tensor run_all_reduce(const StepContext& c, const Step& s, const Tensor& local) {
  auto g = group_of(c, s.mesh_dims);
  const auto [op, divisor] = reduction(c.before, s.mesh_dims);
  Tensor out = output(c, local.dtype(), local.shape());
  all_reduce(*g, {.send = local.bytes(),
                  .recv = out.bytes(),
                  .count = local.numel(),
                  .dtype = local.dtype(),
                  .op = op});
  divide_by(out.dtype(), out.bytes(), out.numel(), divisor);
  return out;
}

Tensor run_all_to_all(const StepContext& c, const Step& s, const Tensor& local) {
  auto g = group_of(c, s.mesh_dims);
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  Tensor out = output(c, local.dtype(), mine.extent);
  ExchangeBoxesOptions o{.src = local.bytes(),
                         .src_shape = local.shape(),
                         .dst = out.bytes(),
                         .dst_shape = out.shape(),
                         .dtype = local.dtype()};
  for (DeviceId peer : g->devices()) {
    const Box to_peer = intersect(mine_before, shard_box(c.after, peer));
    const Box from_peer = intersect(shard_box(c.before, peer), mine);
    o.send.push_back({Box{relative(to_peer, mine_before), to_peer.extent}});
    o.recv.push_back({Box{relative(from_peer, mine), from_peer.extent}});
  }
  exchange_boxes(*g, o);
  return out;
}

Tensor run_local(const StepContext& c, const Step& s, const Tensor& local) {
  const Box mine_before = shard_box(c.before, c.me);
  const Box mine = shard_box(c.after, c.me);
  Tensor out = mine == mine_before ? local.clone()
                                   : slice(local, Box{relative(mine, mine_before), mine.extent});
  std::int64_t divisor = 1;
  for (MeshDim m : s.mesh_dims) {
    if (s.after[m].is_partial() && s.after[m].op == ReduceOp::kSum)
      divisor *= c.before.mesh.shape[m];
  }
  divide_by(out.dtype(), out.bytes(), out.numel(), divisor);
  return out;
}

Tensor run_point_to_point(const Plan& plan, const Step& s, const StepContext& c,
                          const Tensor& local) {
  Communicator& world = c.world;
  const DeviceId me = c.me;
  std::vector<DeviceId> members = plan.from.mesh.devices;
  members.insert(members.end(), plan.to.mesh.devices.begin(), plan.to.mesh.devices.end());
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  auto g = world.group(members);
  auto rank_of = [&](DeviceId d) {
    return static_cast<int>(std::lower_bound(members.begin(), members.end(), d) - members.begin());
  };
  const bool in_from = find_device(plan.from.mesh, me).has_value();
  const bool in_to = find_device(plan.to.mesh, me).has_value();
  const Box src_box = in_from ? shard_box(plan.from, me) : Box{};
  const Box dst_box = in_to ? shard_box(plan.to, me) : Box{};
  const DType dtype = plan.from.dtype;
  // Regions carry a leading term dim: sources hold one term, destinations stage every term.
  auto lead = [](std::int64_t first, const std::vector<std::int64_t>& rest) {
    std::vector<std::int64_t> v{first};
    v.insert(v.end(), rest.begin(), rest.end());
    return v;
  };
  const Shape src_shape = in_from ? lead(1, local.shape()) : Shape{};
  const Shape dst_shape = in_to ? lead(s.terms, dst_box.extent) : Shape{};
  Tensor out = output(c, dtype, in_to ? dst_box.extent : Shape{0});
  Tensor staging;
  std::byte* dst = out.bytes();
  if (in_to && s.terms > 1) {
    staging = Tensor::uninitialized(dtype, dst_shape);
    dst = staging.bytes();
  }
  ExchangeBoxesOptions o{.src = local.bytes(),
                         .src_shape = src_shape,
                         .dst = dst,
                         .dst_shape = dst_shape,
                         .dtype = dtype};
  o.send.resize(members.size());
  o.recv.resize(members.size());
  for (const Transfer& t : s.transfers) {
    if (t.src == me) {
      o.send[rank_of(t.dst)].push_back(
          Box{lead(0, relative(t.box, src_box)), lead(1, t.box.extent)});
    }
    if (t.dst == me) {
      o.recv[rank_of(t.src)].push_back(
          Box{lead(t.term, relative(t.box, dst_box)), lead(1, t.box.extent)});
    }
  }
  exchange_boxes(*g, o);
  if (!in_to) return out;
  if (s.terms > 1) {
    const std::vector<MeshDim> reduced = reduced_partial_dims(plan.from, plan.to);
    std::vector<ReduceOp> ops;
    std::vector<std::int64_t> sizes;
    for (MeshDim m : reduced) {
      ops.push_back(plan.from.placements[m].op);
      sizes.push_back(plan.from.mesh.shape[m]);
    }
    std::vector<const std::byte*> terms;
    const std::size_t block = static_cast<std::size_t>(out.numel()) * size_of(dtype);
    for (int t = 0; t < s.terms; ++t) terms.push_back(staging.bytes() + t * block);
    reduce_partial_terms(ops, sizes, dtype, terms, out.bytes(), out.numel());
  }
  // Destination Partial dims whose terms were not kept from the source: R -> P(sum) divides.
  const bool same_mesh = plan.from.mesh == plan.to.mesh;
  const std::vector<MeshDim> reduced = reduced_partial_dims(plan.from, plan.to);
  std::int64_t divisor = 1;
  for (std::size_t m = 0; m < plan.to.placements.size(); ++m) {
    const Placement& p = plan.to.placements[m];
    const bool kept =
        same_mesh && plan.from.placements[m].is_partial() &&
        std::find(reduced.begin(), reduced.end(), static_cast<MeshDim>(m)) == reduced.end();
    if (p.is_partial() && p.op == ReduceOp::kSum && !kept) divisor *= plan.to.mesh.shape[m];
  }
  divide_by(dtype, out.bytes(), out.numel(), divisor);
  return out;
}

}  // namespace

Tensor execute_plan(const Plan& plan, Communicator& world, const Tensor& local, Tensor recycled) {
  const DeviceId me = world.device();
  const bool in_from = find_device(plan.from.mesh, me).has_value();
  const bool in_to = find_device(plan.to.mesh, me).has_value();
  if (!in_from && !in_to) return Tensor(plan.from.dtype, {0});
  if (in_from && local.shape() != local_shape(plan.from, me)) {
    fail(ErrorKind::kShapeMismatch, "device {} holds a shard of shape {} but layout {} gives it {}",
         me, to_string(local.shape()), to_string(plan.from), to_string(local_shape(plan.from, me)));
  }
  if (in_from && local.dtype() != plan.from.dtype) {
    fail(ErrorKind::kShapeMismatch, "device {} holds {} but layout {} says {}", me,
         to_string(local.dtype()), to_string(plan.from), to_string(plan.from.dtype));
  }
  // Size-1 mesh dims take their target placement without a step (the box does not change).
  if (plan.steps.empty()) return local.clone();
  const Tensor* current = &local;
  Tensor result;
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const Layout before = with_placements(plan.from, s.before);
    const Layout after = with_placements(plan.from, s.after);
    const bool last = i + 1 == plan.steps.size();
    const StepContext c{before, after, world, me, last ? &recycled : nullptr};
    Tensor next;
    switch (s.kind) {
      case StepKind::kAllGather:
        next = run_all_gather(c, s, *current);
        break;
      case StepKind::kReduceScatter:
        next = run_reduce_scatter(c, s, *current);
        break;
      case StepKind::kAllReduce:
        next = run_all_reduce(c, s, *current);
        break;
      case StepKind::kAllToAll:
        next = run_all_to_all(c, s, *current);
        break;
      case StepKind::kLocal:
        next = run_local(c, s, *current);
        break;
      case StepKind::kPointToPoint:
        next = run_point_to_point(plan, s, c, *current);
        break;
    }
    result = std::move(next);
    current = &result;
  }
  return result;
}

std::shared_ptr<const Plan> PlanCache::get(const Layout& from, const Layout& to) {
  Key key{from, to};
  {
    std::lock_guard lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
  }
  auto plan = std::make_shared<const Plan>(plan_redistribute(from, to, options_));
  std::lock_guard lock(mu_);
  return plans_.emplace(std::move(key), std::move(plan)).first->second;
}

}  // namespace meshflow
