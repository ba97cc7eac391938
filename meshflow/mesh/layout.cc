// Layout validation and shard boxes.
#include "meshflow/mesh/layout.h"

#include <algorithm>

#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"

namespace meshflow {

Layout make_layout(DeviceMesh mesh, std::vector<Placement> placements, Shape shape, DType dtype) {
  if (static_cast<int>(placements.size()) != ndim(mesh)) {
    fail(ErrorKind::kInvalidArgument,
         "mesh {} has {} dims but placements \"{}\" give {}: give one placement per mesh dim",
         to_string(mesh), ndim(mesh), to_string(placements), placements.size());
  }
  checked_numel(shape, dtype, "shape");
  const int rank = static_cast<int>(shape.size());
  for (Placement& p : placements) {
    if (!p.is_shard()) continue;
    if (p.dim < -rank || p.dim >= rank) {
      fail(ErrorKind::kInvalidArgument,
           "placement \"{}\" names tensor dim {} but the tensor has {} dims", to_string(p), p.dim,
           rank);
    }
    if (p.dim < 0) p.dim += rank;
  }
  for (const Placement& p : placements) {
    // The value of integer Partial(avg) terms would depend on the order the division truncates.
    if (p.is_partial() && p.op == ReduceOp::kAvg && !is_floating(dtype)) {
      fail(ErrorKind::kInvalidArgument,
           "placement \"{}\" needs a floating-point dtype: an integer average would truncate "
           "differently depending on the reduction order ({} given)",
           to_string(p), to_string(dtype));
    }
  }
  return Layout{std::move(mesh), std::move(placements), std::move(shape), dtype};
}

std::size_t hash_value(const Layout& layout) {
  std::size_t h = 1469598103934665603ull;
  auto mix = [&h](std::int64_t v) { h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull; };
  for (auto e : layout.mesh.shape) mix(e);
  mix(-1);
  for (auto d : layout.mesh.devices) mix(d);
  mix(-2);
  for (const Placement& p : layout.placements) {
    mix(static_cast<int>(p.kind));
    mix(p.dim);
    mix(static_cast<int>(p.op));
  }
  mix(-3);
  for (auto e : layout.shape) mix(e);
  mix(static_cast<int>(layout.dtype));
  return h;
}

std::string to_string(const Layout& layout) {
  return fmt::format("mesh {} placements {} shape {} {}", to_string(layout.mesh),
                     to_string(layout.placements), to_string(layout.shape),
                     to_string(layout.dtype));
}

Chunk chunk(std::int64_t size, std::int64_t parts, std::int64_t index) {
  MESHFLOW_CHECK(parts >= 1 && index >= 0 && index < parts && size >= 0);
  const std::int64_t c = (size + parts - 1) / parts;
  const std::int64_t lo = std::min(size, index * c);
  const std::int64_t hi = std::min(size, (index + 1) * c);
  return Chunk{lo, hi - lo};
}

Box shard_box(const Layout& layout, DeviceId device) {
  return shard_box_at(layout, coordinates(layout.mesh, device));
}

Box shard_box_at(const Layout& layout, const std::vector<std::int64_t>& coords) {
  Box box = full_box(layout.shape);
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    const Placement& p = layout.placements[m];
    if (!p.is_shard()) continue;
    Chunk c = chunk(box.extent[p.dim], layout.mesh.shape[m], coords[m]);
    box.offset[p.dim] += c.offset;
    box.extent[p.dim] = c.extent;
  }
  return box;
}

Shape local_shape(const Layout& layout, DeviceId device) {
  return shard_box(layout, device).extent;
}

std::vector<MeshDim> partial_dims(const Layout& layout) {
  std::vector<MeshDim> dims;
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    if (layout.placements[m].is_partial()) dims.push_back(static_cast<MeshDim>(m));
  }
  return dims;
}

}  // namespace meshflow
