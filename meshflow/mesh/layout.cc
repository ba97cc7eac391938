// Layout validation and shard boxes.
#include "meshflow/mesh/layout.h"

#include <algorithm>

#include "meshflow/core/error.h"

namespace meshflow {

Layout make_layout(DeviceMesh mesh, std::vector<Placement> placements, Shape shape, DType dtype) {
  if (static_cast<int>(placements.size()) != ndim(mesh)) {
    fail(ErrorKind::kInvalidArgument, "placements \"{}\" give {} entries but mesh {} has {} dims",
         to_string(placements), placements.size(), to_string(mesh), ndim(mesh));
  }
  for (std::int64_t e : shape) {
    if (e < 0) fail(ErrorKind::kInvalidArgument, "shape {} has a negative extent", to_string(shape));
  }
  const int rank = static_cast<int>(shape.size());
  for (Placement& p : placements) {
    if (!p.is_shard()) continue;
    if (p.dim < -rank || p.dim >= rank) {
      fail(ErrorKind::kInvalidArgument, "placement \"{}\" names tensor dim {} but the tensor has {} dims",
           to_string(p), p.dim, rank);
    }
    if (p.dim < 0) p.dim += rank;
  }
  return Layout{std::move(mesh), std::move(placements), std::move(shape), dtype};
}

std::string to_string(const Layout& layout) {
  return fmt::format("mesh {} placements {} shape {} {}", to_string(layout.mesh),
                     to_string(layout.placements), to_string(layout.shape), to_string(layout.dtype));
}

Chunk chunk(std::int64_t size, std::int64_t parts, std::int64_t index) {
  MESHFLOW_CHECK(parts >= 1 && index >= 0 && index < parts && size >= 0);
  const std::int64_t c = (size + parts - 1) / parts;
  const std::int64_t lo = std::min(size, index * c);
  const std::int64_t hi = std::min(size, (index + 1) * c);
  return Chunk{lo, hi - lo};
}

Box shard_box(const Layout& layout, DeviceId device) {
  const std::vector<std::int64_t> coords = coordinates(layout.mesh, device);
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

Shape local_shape(const Layout& layout, DeviceId device) { return shard_box(layout, device).extent; }

std::vector<MeshDim> partial_dims(const Layout& layout) {
  std::vector<MeshDim> dims;
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    if (layout.placements[m].is_partial()) dims.push_back(static_cast<MeshDim>(m));
  }
  return dims;
}

}  // namespace meshflow
