// DeviceMesh construction, text form and groups.
#include "meshflow/mesh/device_mesh.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"

namespace meshflow {

namespace {

std::string join(const std::vector<DeviceId>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

}  // namespace

DeviceMesh make_mesh(Shape shape, std::vector<DeviceId> devices, std::vector<std::string> names) {
  const std::int64_t count =
      checked_mesh_size(shape, "mesh shape");
  if (static_cast<std::int64_t>(devices.size()) != count) {
    fail(ErrorKind::kInvalidArgument, "mesh shape {} needs {} devices but {} were given{}",
         to_string(shape), count, devices.size(),
         devices.size() <= 16 ? " (" + join(devices) + ")" : "");
  }
  std::set<DeviceId> seen;
  for (DeviceId d : devices) {
    if (d < 0) fail(ErrorKind::kInvalidArgument, "mesh device id {} is negative", d);
    if (!seen.insert(d).second) {
      fail(ErrorKind::kInvalidArgument, "mesh lists device {} twice", d);
    }
  }
  if (!names.empty()) {
    if (names.size() != shape.size()) {
      fail(ErrorKind::kInvalidArgument, "mesh shape {} has {} dims but {} names were given",
           to_string(shape), shape.size(), names.size());
    }
    std::set<std::string> seen_names;
    for (const std::string& n : names) {
      if (n.empty() || !seen_names.insert(n).second) {
        fail(ErrorKind::kInvalidArgument, "mesh dim name \"{}\" is empty or repeated", n);
      }
    }
  }
  return DeviceMesh{std::move(shape), std::move(devices), std::move(names)};
}

DeviceMesh make_mesh(Shape shape) {
  std::vector<DeviceId> devices(static_cast<std::size_t>(
      checked_mesh_size(shape, "mesh shape")));
  for (std::size_t i = 0; i < devices.size(); ++i) devices[i] = static_cast<DeviceId>(i);
  return make_mesh(std::move(shape), std::move(devices));
}

DeviceMesh parse_mesh(std::string_view text) {
  const std::size_t at = text.find('@');
  Shape shape;
  try {
    shape = parse_shape(text.substr(0, at));
  } catch (const Error&) {
    fail(ErrorKind::kInvalidArgument, "malformed mesh \"{}\" (expected e.g. 2x2 or 2x2@4,5,6,7)",
         text);
  }
  if (shape.empty()) fail(ErrorKind::kInvalidArgument, "malformed mesh \"{}\": no dims", text);
  if (at == std::string_view::npos) return make_mesh(shape);
  std::vector<DeviceId> devices;
  std::string_view rest = text.substr(at + 1);
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    std::size_t end = rest.find(',', pos);
    if (end == std::string_view::npos) end = rest.size();
    std::string_view part = rest.substr(pos, end - pos);
    DeviceId id = -1;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), id);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size()) {
      fail(ErrorKind::kInvalidArgument, "malformed device id \"{}\" in mesh \"{}\"", part, text);
    }
    devices.push_back(id);
    pos = end + 1;
  }
  return make_mesh(shape, std::move(devices));
}

std::string to_string(const DeviceMesh& mesh) {
  std::string out = to_string(mesh.shape);
  for (std::size_t i = 0; i < mesh.devices.size(); ++i) {
    if (mesh.devices[i] != static_cast<DeviceId>(i)) return out + "@" + join(mesh.devices);
  }
  return out;
}

std::optional<int> find_device(const DeviceMesh& mesh, DeviceId device) {
  // Most meshes list consecutive devices: try that position first.
  if (!mesh.devices.empty()) {
    const std::int64_t guess = static_cast<std::int64_t>(device) - mesh.devices[0];
    if (guess >= 0 && guess < static_cast<std::int64_t>(mesh.devices.size()) &&
        mesh.devices[static_cast<std::size_t>(guess)] == device)
      return static_cast<int>(guess);
  }
  auto it = std::find(mesh.devices.begin(), mesh.devices.end(), device);
  if (it == mesh.devices.end()) return std::nullopt;
  return static_cast<int>(it - mesh.devices.begin());
}

std::vector<std::int64_t> coordinates(const DeviceMesh& mesh, DeviceId device) {
  std::optional<int> pos = find_device(mesh, device);
  if (!pos)
    fail(ErrorKind::kInvalidArgument, "device {} is not in mesh {}", device, to_string(mesh));
  return coordinates_at(mesh, *pos);
}

std::vector<std::int64_t> coordinates_at(const DeviceMesh& mesh, std::int64_t index) {
  std::vector<std::int64_t> coords(mesh.shape.size());
  std::int64_t rem = index;
  for (std::size_t d = mesh.shape.size(); d-- > 0;) {
    coords[d] = rem % mesh.shape[d];
    rem /= mesh.shape[d];
  }
  return coords;
}

DeviceId device_at(const DeviceMesh& mesh, const std::vector<std::int64_t>& coords) {
  MESHFLOW_CHECK(coords.size() == mesh.shape.size());
  std::int64_t pos = 0;
  for (std::size_t d = 0; d < coords.size(); ++d) {
    MESHFLOW_CHECK(coords[d] >= 0 && coords[d] < mesh.shape[d]);
    pos = pos * mesh.shape[d] + coords[d];
  }
  return mesh.devices[static_cast<std::size_t>(pos)];
}

namespace {

std::vector<MeshDim> normalise_dims(const DeviceMesh& mesh, std::vector<MeshDim> dims) {
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  for (MeshDim d : dims) {
    if (d < 0 || d >= ndim(mesh)) {
      fail(ErrorKind::kInvalidArgument, "mesh dim {} out of range for mesh {}", d, to_string(mesh));
    }
  }
  return dims;
}

}  // namespace

std::vector<DeviceId> group_along(const DeviceMesh& mesh, DeviceId device,
                                  std::vector<MeshDim> dims) {
  dims = normalise_dims(mesh, std::move(dims));
  std::vector<std::int64_t> coords = coordinates(mesh, device);
  std::int64_t count = 1;
  for (MeshDim d : dims) count *= mesh.shape[d];
  std::vector<DeviceId> group;
  group.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t rem = i;
    for (std::size_t k = dims.size(); k-- > 0;) {
      coords[dims[k]] = rem % mesh.shape[dims[k]];
      rem /= mesh.shape[dims[k]];
    }
    group.push_back(device_at(mesh, coords));
  }
  return group;
}

DeviceMesh sub_mesh(const DeviceMesh& mesh, DeviceId device, std::vector<MeshDim> dims) {
  dims = normalise_dims(mesh, std::move(dims));
  DeviceMesh out;
  for (MeshDim d : dims) {
    out.shape.push_back(mesh.shape[d]);
    if (!mesh.names.empty()) out.names.push_back(mesh.names[d]);
  }
  out.devices = group_along(mesh, device, dims);
  return out;
}

MeshDim parse_mesh_dim(const DeviceMesh& mesh, std::string_view name) {
  for (std::size_t d = 0; d < mesh.names.size(); ++d) {
    if (mesh.names[d] == name) return static_cast<MeshDim>(d);
  }
  MeshDim d = -1;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), d);
  if (ec != std::errc() || ptr != name.data() + name.size() || d < 0 || d >= ndim(mesh)) {
    fail(ErrorKind::kInvalidArgument, "mesh {} has no dim \"{}\"", to_string(mesh), name);
  }
  return d;
}

}  // namespace meshflow
