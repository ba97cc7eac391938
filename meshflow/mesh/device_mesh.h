// DeviceMesh: an N-d array of device ids (mesh dim 0 outermost), its text form "2x2@4,5,6,7",
// device coordinates, and the groups of devices along sets of mesh dims.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/core/device_id.h"
#include "meshflow/core/shape.h"

namespace meshflow {

// An index into a DeviceMesh's dims (0 = outermost).
using MeshDim = int;

// Invariants (checked by make_mesh): every extent >= 1, devices.size() == product of extents,
// device ids are distinct and non-negative, names empty or one distinct non-empty name per dim.
struct DeviceMesh {
  Shape shape;
  std::vector<DeviceId> devices;   // row-major over shape
  std::vector<std::string> names;  // optional dim names ("dp", "tp")

  bool operator==(const DeviceMesh&) const = default;
};

// Returns a validated mesh; throws Error naming the offending value.
DeviceMesh make_mesh(Shape shape, std::vector<DeviceId> devices,
                     std::vector<std::string> names = {});

// Returns the mesh of `shape` over devices 0..n-1 in row-major order.
DeviceMesh make_mesh(Shape shape);

// Returns the mesh written as "2x2" or "2x2@4,5,6,7"; throws Error naming `text` if malformed.
DeviceMesh parse_mesh(std::string_view text);

// Returns "2x2" when devices are 0..n-1 in order, otherwise "2x2@4,5,6,7".
std::string to_string(const DeviceMesh& mesh);

// Returns the number of mesh dims.
inline int ndim(const DeviceMesh& mesh) { return static_cast<int>(mesh.shape.size()); }

// Returns the number of devices.
inline int size(const DeviceMesh& mesh) { return static_cast<int>(mesh.devices.size()); }

// Returns the row-major position of `device` in the mesh, or nullopt if the mesh lacks it.
std::optional<int> find_device(const DeviceMesh& mesh, DeviceId device);

// Returns the coordinates of `device`; throws Error if the mesh does not hold it.
std::vector<std::int64_t> coordinates(const DeviceMesh& mesh, DeviceId device);

// Returns the coordinates of the device at row-major position `index`.
std::vector<std::int64_t> coordinates_at(const DeviceMesh& mesh, std::int64_t index);

// Returns the device at `coords`.
DeviceId device_at(const DeviceMesh& mesh, const std::vector<std::int64_t>& coords);

// Returns the devices that share every coordinate of `device` except those on `dims`, ordered
// row-major over `dims` taken in ascending order. With several dims this is a "flattened" group.
// An empty `dims` gives {device}.
std::vector<DeviceId> group_along(const DeviceMesh& mesh, DeviceId device,
                                  std::vector<MeshDim> dims);

// Returns the mesh of the group_along(mesh, device, dims): its shape is the extents of `dims`
// (ascending) and its names the names of those dims.
DeviceMesh sub_mesh(const DeviceMesh& mesh, DeviceId device, std::vector<MeshDim> dims);

// Returns the mesh dim named `name` or written as its index ("1"); throws Error otherwise.
MeshDim parse_mesh_dim(const DeviceMesh& mesh, std::string_view name);

}  // namespace meshflow
