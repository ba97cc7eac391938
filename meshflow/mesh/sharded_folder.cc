// Sharded folders on disk.
#include "meshflow/mesh/sharded_folder.h"

#include <limits>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"
#include "meshflow/core/limits.h"
#include "meshflow/core/npy.h"

namespace meshflow {

namespace fs = std::filesystem;

std::string shard_file_name(int mesh_index) { return fmt::format("rank{}.npy", mesh_index); }

nlohmann::json layout_to_json(const Layout& layout) {
  nlohmann::json placements = nlohmann::json::array();
  for (const Placement& p : layout.placements) placements.push_back(to_string(p));
  return {
      {"mesh",
       {{"shape", layout.mesh.shape},
        {"devices", layout.mesh.devices},
        {"names", layout.mesh.names}}},
      {"placements", placements},
      {"shape", layout.shape},
      {"dtype", to_string(layout.dtype)},
  };
}

Layout layout_from_json(const nlohmann::json& json, std::string_view source) {
  const JsonField root(json, std::string(source));
  auto shape_of = [](const JsonField& f, std::int64_t lo, std::int64_t hi) {
    Shape out;
    for (std::size_t i = 0; i < f.size(); ++i) out.push_back(f.at(i).as_int(lo, hi));
    return out;
  };
  try {
    const JsonField mesh = root.member("mesh");
    const Shape mesh_shape = shape_of(mesh.member("shape"), 1, kMaxMeshDevices);
    const JsonField device_list = mesh.member("devices");
    std::vector<DeviceId> devices;
    // Sized by the list, never by a declared count: the mesh check compares the two.
    for (std::size_t i = 0; i < device_list.size(); ++i) {
      devices.push_back(
          static_cast<DeviceId>(device_list.at(i).as_int(0, std::numeric_limits<DeviceId>::max())));
    }
    std::vector<std::string> names;
    if (auto n = mesh.find("names")) {
      for (std::size_t i = 0; i < n->size(); ++i) names.push_back(n->at(i).as_string());
    }
    std::vector<Placement> placements;
    const JsonField ps = root.member("placements");
    for (std::size_t i = 0; i < ps.size(); ++i)
      placements.push_back(parse_placement(ps.at(i).as_string()));
    const Shape shape = shape_of(root.member("shape"), 0, kMaxTensorBytes);
    const DType dtype = parse_dtype(root.member("dtype").as_string());
    return make_layout(make_mesh(mesh_shape, devices, names), placements, shape, dtype);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kIo) throw;
    fail(ErrorKind::kIo, "{}: {}", source, e.what());
  }
}

Layout read_layout(const fs::path& dir) {
  if (!fs::is_directory(dir))
    fail(ErrorKind::kIo, "\"{}\" is not a sharded tensor folder", dir.string());
  const fs::path file = dir / "layout.json";
  if (!fs::exists(file)) {
    fail(ErrorKind::kIo, "\"{}\" is not a sharded tensor folder: it has no layout.json",
         dir.string());
  }
  return layout_from_json(parse_json(read_file(file), file.string()), file.string());
}

Tensor read_shard(const fs::path& dir, const Layout& layout, int mesh_index) {
  const fs::path file = dir / shard_file_name(mesh_index);
  Tensor t = read_npy(file);
  const DeviceId d = layout.mesh.devices[mesh_index];
  const Box box = shard_box(layout, d);
  if (t.dtype() != layout.dtype || t.shape() != box.extent) {
    fail(ErrorKind::kIo, "{}: holds {} {} but layout.json gives device {} box {} ({} {})",
         file.string(), to_string(t.shape()), to_string(t.dtype()), d, to_string(box),
         to_string(box.extent), to_string(layout.dtype));
  }
  return t;
}

ShardedTensor read_sharded(const fs::path& dir) {
  ShardedTensor st{read_layout(dir), {}};
  for (int i = 0; i < size(st.layout.mesh); ++i) st.shards.push_back(read_shard(dir, st.layout, i));
  return st;
}

namespace {

// Clears what killed writers of `target` left and creates its empty staging folder.
fs::path create_staging(const fs::path& target) {
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(parent)) {
    fail(ErrorKind::kIo, "cannot write \"{}\": folder \"{}\" does not exist", target.string(),
         parent.string());
  }
  clear_stale(target);
  const fs::path staged = staging_path(target);
  std::error_code ec;
  if (!fs::create_directory(staged, ec))
    fail(ErrorKind::kIo, "cannot create \"{}\": {}", staged.string(), ec.message());
  return staged;
}

bool is_sharded_folder(const fs::path& dir) {
  return fs::is_directory(dir) && fs::exists(dir / "layout.json");
}

}  // namespace

fs::path stage_folder(const fs::path& dir) {
  const fs::path target = output_target(dir);
  if (fs::exists(target) &&
      !(is_sharded_folder(target) || (fs::is_directory(target) && fs::is_empty(target)))) {
    fail(ErrorKind::kIo, "refusing to replace \"{}\": it exists and is not a sharded tensor folder",
         target.string());
  }
  return create_staging(target);
}

fs::path stage_folder_of_folders(const fs::path& dir) {
  const fs::path target = output_target(dir);
  if (fs::exists(target)) {
    bool ours = fs::is_directory(target);
    if (ours) {
      for (const auto& entry : fs::directory_iterator(target))
        ours = ours && is_sharded_folder(entry.path());
    }
    if (!ours) {
      fail(ErrorKind::kIo,
           "refusing to replace \"{}\": it exists and is not a folder of sharded tensors",
           target.string());
    }
  }
  return create_staging(target);
}

void commit_folder(const fs::path& staged, const fs::path& dir) {
  publish(staged, output_target(dir));
}

void write_sharded(const fs::path& dir, const Layout& layout, const std::vector<Tensor>& shards) {
  MESHFLOW_CHECK(shards.size() == layout.mesh.devices.size());
  const fs::path staged = stage_folder(dir);
  try {
    write_file_atomic(staged / "layout.json", layout_to_json(layout).dump(2) + "\n");
    for (std::size_t i = 0; i < shards.size(); ++i)
      write_npy(staged / shard_file_name(static_cast<int>(i)), shards[i]);
  } catch (...) {
    discard(staged);
    throw;
  }
  commit_folder(staged, dir);
}

}  // namespace meshflow
