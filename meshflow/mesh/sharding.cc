// shard_tensor and assemble.
#include "meshflow/mesh/sharding.h"

#include <functional>

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"

namespace meshflow {

std::vector<Tensor> shard_tensor(const Tensor& global, const Layout& layout) {
  if (global.shape() != layout.shape || global.dtype() != layout.dtype) {
    fail(ErrorKind::kShapeMismatch, "tensor of shape {} {} does not match layout {}",
         to_string(global.shape()), to_string(global.dtype()), to_string(layout));
  }
  for (const Placement& p : layout.placements) {
    if (p.is_partial()) {
      fail(ErrorKind::kInvalidArgument,
           "cannot shard a full tensor onto placement \"{}\": use S(d) or R, then redistribute",
           to_string(p));
    }
  }
  std::vector<Tensor> shards;
  shards.reserve(layout.mesh.devices.size());
  for (DeviceId d : layout.mesh.devices) shards.push_back(slice(global, shard_box(layout, d)));
  return shards;
}

namespace {

// Returns the full value of the Partial group containing `device` (whose Partial coordinates
// are 0), reduced as assemble() documents.
Tensor reduce_partial(const Layout& layout, const std::vector<Tensor>& shards, DeviceId device) {
  const DeviceMesh& mesh = layout.mesh;
  const std::vector<MeshDim> pdims = partial_dims(layout);
  auto shard_of = [&](DeviceId d) -> const Tensor& { return shards[*find_device(mesh, d)]; };
  if (pdims.empty()) return shard_of(device).clone();

  bool all_sum_avg = true, all_same = true;
  std::int64_t avg_divisor = 1;
  for (MeshDim m : pdims) {
    ReduceOp op = layout.placements[m].op;
    all_sum_avg = all_sum_avg && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
    all_same = all_same && op == layout.placements[pdims[0]].op;
    if (op == ReduceOp::kAvg) avg_divisor *= mesh.shape[m];
  }
  const Tensor& mine = shard_of(device);
  Tensor out(mine.dtype(), mine.shape());
  if (all_sum_avg || all_same) {
    std::vector<const std::byte*> terms;
    for (DeviceId d : group_along(mesh, device, pdims)) terms.push_back(shard_of(d).bytes());
    ReduceOp op = all_sum_avg ? ReduceOp::kSum : layout.placements[pdims[0]].op;
    reduce_terms(op, out.dtype(), terms, out.bytes(), out.numel());
    if (all_sum_avg) divide_by(out.dtype(), out.bytes(), out.numel(), avg_divisor);
    return out;
  }
  // Mixed ops: value = op_outer(op_inner(...)), so recurse from the outermost Partial dim.
  std::function<Tensor(std::size_t, DeviceId)> reduce_from = [&](std::size_t k, DeviceId d) -> Tensor {
    if (k == pdims.size()) return shard_of(d).clone();
    std::vector<Tensor> parts;
    for (DeviceId member : group_along(mesh, d, {pdims[k]})) parts.push_back(reduce_from(k + 1, member));
    std::vector<const std::byte*> terms;
    for (const Tensor& t : parts) terms.push_back(t.bytes());
    Tensor r(mine.dtype(), mine.shape());
    reduce_terms(layout.placements[pdims[k]].op, r.dtype(), terms, r.bytes(), r.numel());
    return r;
  };
  return reduce_from(0, device);
}

}  // namespace

Tensor assemble(const Layout& layout, const std::vector<Tensor>& shards) {
  const DeviceMesh& mesh = layout.mesh;
  if (shards.size() != mesh.devices.size()) {
    fail(ErrorKind::kShapeMismatch, "mesh {} has {} devices but {} shards were given",
         to_string(mesh), mesh.devices.size(), shards.size());
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const DeviceId d = mesh.devices[i];
    const Box box = shard_box(layout, d);
    if (shards[i].dtype() != layout.dtype) {
      fail(ErrorKind::kShapeMismatch, "shard of device {} (rank{}) is {} but the layout says {}", d,
           i, to_string(shards[i].dtype()), to_string(layout.dtype));
    }
    if (shards[i].shape() != box.extent) {
      fail(ErrorKind::kShapeMismatch,
           "shard of device {} (rank{}) has shape {} but the layout gives it box {} of shape {}", d,
           i, to_string(shards[i].shape()), to_string(box), to_string(box.extent));
    }
  }
  const std::vector<MeshDim> pdims = partial_dims(layout);
  std::vector<MeshDim> rdims;
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    if (layout.placements[m].is_replicate()) rdims.push_back(static_cast<MeshDim>(m));
  }
  const bool tolerant = !pdims.empty() && is_floating(layout.dtype);
  const double rtol = layout.dtype == DType::kFloat32 ? 1e-4 : 1e-10;

  Tensor global(layout.dtype, layout.shape);
  for (DeviceId d : mesh.devices) {
    const std::vector<std::int64_t> coords = coordinates(mesh, d);
    bool representative = true;
    for (MeshDim m : pdims) representative = representative && coords[m] == 0;
    for (MeshDim m : rdims) representative = representative && coords[m] == 0;
    if (!representative) continue;
    const Box box = shard_box(layout, d);
    Tensor value = reduce_partial(layout, shards, d);
    // Every replica (other coordinates on Replicate dims) must hold the same value.
    for (DeviceId other : group_along(mesh, d, rdims)) {
      if (other == d) continue;
      Tensor replica = reduce_partial(layout, shards, other);
      auto diff = tolerant ? compare_close(replica, value, rtol, rtol) : compare_exact(replica, value);
      if (diff) {
        fail(ErrorKind::kShapeMismatch, "replicas disagree: devices {} and {} hold different values for box {} ({})",
             d, other, to_string(box), *diff);
      }
    }
    copy_box(value, full_box(value.shape()), global, box.offset);
  }
  return global;
}

}  // namespace meshflow
