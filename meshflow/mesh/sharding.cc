// shard_tensor and assemble.
#include "meshflow/mesh/sharding.h"

#include <cstring>

#include "meshflow/core/error.h"

namespace meshflow {

std::vector<Tensor> shard_tensor(const Tensor& global, const Layout& layout) {
  if (global.shape() != layout.shape || global.dtype() != layout.dtype) {
    fail(ErrorKind::kShapeMismatch, "tensor of shape {} {} does not match layout {}",
         to_string(global.shape()), to_string(global.dtype()), to_string(layout));
  }
  check_shardable(layout);
  std::vector<Tensor> shards;
  shards.reserve(layout.mesh.devices.size());
  for (DeviceId d : layout.mesh.devices) shards.push_back(slice(global, shard_box(layout, d)));
  return shards;
}

void check_shardable(const Layout& layout) {
  for (const Placement& p : layout.placements) {
    if (p.is_partial()) {
      fail(ErrorKind::kInvalidArgument,
           "cannot shard a full tensor onto placement \"{}\": use S(d) or R, then redistribute",
           to_string(p));
    }
  }
}

std::optional<DeviceId> replica_reference(const Layout& layout, DeviceId device) {
  std::vector<std::int64_t> coords = coordinates(layout.mesh, device);
  bool moved = false;
  for (std::size_t m = 0; m < coords.size(); ++m) {
    if (layout.placements[m].is_replicate() && coords[m] != 0) {
      coords[m] = 0;
      moved = true;
    }
  }
  if (!moved) return std::nullopt;
  return device_at(layout.mesh, coords);
}

void fail_replicas_disagree(const Layout& layout, DeviceId device) {
  const DeviceId reference = replica_reference(layout, device).value_or(device);
  fail(ErrorKind::kShapeMismatch,
       "replicas disagree: devices {} (rank{}) and {} (rank{}) hold different values for box {}",
       reference, *find_device(layout.mesh, reference), device, *find_device(layout.mesh, device),
       to_string(shard_box(layout, device)));
}

PartialGroup partial_group(const Layout& layout) {
  PartialGroup g;
  g.dims = partial_dims(layout);
  for (MeshDim m : g.dims) {
    g.ops.push_back(layout.placements[m].op);
    g.sizes.push_back(layout.mesh.shape[m]);
  }
  return g;
}

bool is_representative(const Layout& layout, DeviceId device) {
  const std::vector<std::int64_t> coords = coordinates(layout.mesh, device);
  for (std::size_t m = 0; m < coords.size(); ++m) {
    if (!layout.placements[m].is_shard() && coords[m] != 0) return false;
  }
  return true;
}

Tensor assemble(const Layout& layout, const std::vector<Tensor>& shards) {
  std::vector<const Tensor*> borrowed;
  borrowed.reserve(shards.size());
  for (const Tensor& t : shards) borrowed.push_back(&t);
  return assemble(layout, borrowed);
}

Tensor assemble(const Layout& layout, const std::vector<const Tensor*>& shards) {
  const DeviceMesh& mesh = layout.mesh;
  if (shards.size() != mesh.devices.size()) {
    fail(ErrorKind::kShapeMismatch, "mesh {} has {} devices but {} shards were given",
         to_string(mesh), mesh.devices.size(), shards.size());
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const DeviceId d = mesh.devices[i];
    const Box box = shard_box(layout, d);
    if (shards[i]->dtype() != layout.dtype) {
      fail(ErrorKind::kShapeMismatch, "shard of device {} (rank{}) is {} but the layout says {}", d,
           i, to_string(shards[i]->dtype()), to_string(layout.dtype));
    }
    if (shards[i]->shape() != box.extent) {
      fail(ErrorKind::kShapeMismatch,
           "shard of device {} (rank{}) has shape {} but the layout gives it box {} of shape {}", d,
           i, to_string(shards[i]->shape()), to_string(box), to_string(box.extent));
    }
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const auto reference = replica_reference(layout, mesh.devices[i]);
    if (!reference) continue;
    const Tensor& a = *shards[*find_device(mesh, *reference)];
    if (std::memcmp(a.bytes(), shards[i]->bytes(), a.nbytes()) != 0)
      fail_replicas_disagree(layout, mesh.devices[i]);
  }
  Tensor global = Tensor::uninitialized(layout.dtype, layout.shape);
  for (DeviceId d : mesh.devices) assemble_part(layout, shards, d, global);
  return global;
}

void assemble_part(const Layout& layout, const std::vector<const Tensor*>& shards, DeviceId device,
                   Tensor& global) {
  if (!is_representative(layout, device)) return;
  const DeviceMesh& mesh = layout.mesh;
  const Box box = shard_box(layout, device);
  const PartialGroup group = partial_group(layout);
  const Tensor& own = *shards[*find_device(mesh, device)];
  if (group.dims.empty()) {
    copy_box(own, full_box(own.shape()), global, box.offset);
    return;
  }
  std::vector<const std::byte*> terms;
  for (DeviceId t : group_along(mesh, device, group.dims))
    terms.push_back(shards[*find_device(mesh, t)]->bytes());
  const auto elem = static_cast<std::int64_t>(size_of(layout.dtype));
  if (auto at = contiguous_offset(box, full_box(layout.shape))) {  // reduced where it belongs
    reduce_partial_terms(group.ops, group.sizes, layout.dtype, terms, global.bytes() + *at * elem,
                         numel(box.extent));
    return;
  }
  Tensor value = Tensor::uninitialized(layout.dtype, box.extent);
  reduce_partial_terms(group.ops, group.sizes, layout.dtype, terms, value.bytes(), value.numel());
  copy_box(value, full_box(value.shape()), global, box.offset);
}

}  // namespace meshflow
