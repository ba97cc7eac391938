// Layout: a tensor's mesh, one placement per mesh dim, global shape and dtype; the shard box
// each device holds under DTensor's chunk rule.
#pragma once

#include <cstdint>
#include <vector>

#include "meshflow/core/box.h"
#include "meshflow/core/dtype.h"
#include "meshflow/mesh/device_mesh.h"
#include "meshflow/mesh/placement.h"

namespace meshflow {

// Invariants (checked by make_layout): placements.size() == ndim(mesh); every Shard dim lies
// in [0, shape.size()) (negative dims were normalised).
struct Layout {
  DeviceMesh mesh;
  std::vector<Placement> placements;
  Shape shape;
  DType dtype = DType::kFloat32;

  bool operator==(const Layout&) const = default;
};

// Returns a validated layout with negative shard dims normalised; throws Error naming the
// offending placement or count.
Layout make_layout(DeviceMesh mesh, std::vector<Placement> placements, Shape shape,
                   DType dtype = DType::kFloat32);

// Returns a hash of every field (for plan caches).
std::size_t hash_value(const Layout& layout);

// Returns "mesh 2x2 placements S(0),R shape 8x8 float32".
std::string to_string(const Layout& layout);

// The chunk rule: a dim of `size` over `parts` gives chunk c = ceil(size/parts); part i holds
// [i*c, min(size, (i+1)*c)), possibly empty. Returns {offset, extent} of part `index`.
struct Chunk {
  std::int64_t offset;
  std::int64_t extent;
};
Chunk chunk(std::int64_t size, std::int64_t parts, std::int64_t index);

// Returns the box of the global tensor that `device` holds. Mesh dims that shard the same
// tensor dim apply the chunk rule outer mesh dim first. Throws Error if the mesh lacks `device`.
Box shard_box(const Layout& layout, DeviceId device);

// Returns the box of the device at mesh coordinates `coords` (no device lookup).
Box shard_box_at(const Layout& layout, const std::vector<std::int64_t>& coords);

// Returns the local shape `device` holds (the extent of its shard box).
Shape local_shape(const Layout& layout, DeviceId device);

// Returns the mesh dims whose placement is Partial.
std::vector<MeshDim> partial_dims(const Layout& layout);

}  // namespace meshflow
