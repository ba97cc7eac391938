// Sharded folders on disk.
#include "meshflow/mesh/sharded_folder.h"

#include <unistd.h>

#include "meshflow/core/error.h"
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
  auto field = [&](const nlohmann::json& obj, const char* key,
                   const char* where) -> const nlohmann::json& {
    if (!obj.is_object() || !obj.contains(key)) {
      fail(ErrorKind::kIo, "{}: missing field \"{}\"{}", source, key, where);
    }
    return obj.at(key);
  };
  try {
    const nlohmann::json& mesh = field(json, "mesh", "");
    Shape mesh_shape = field(mesh, "shape", " in \"mesh\"").get<Shape>();
    std::vector<DeviceId> devices =
        field(mesh, "devices", " in \"mesh\"").get<std::vector<DeviceId>>();
    std::vector<std::string> names;
    if (mesh.contains("names")) names = mesh.at("names").get<std::vector<std::string>>();
    std::vector<Placement> placements;
    for (const auto& p : field(json, "placements", ""))
      placements.push_back(parse_placement(p.get<std::string>()));
    Shape shape = field(json, "shape", "").get<Shape>();
    DType dtype = parse_dtype(field(json, "dtype", "").get<std::string>());
    return make_layout(make_mesh(mesh_shape, devices, names), placements, shape, dtype);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kIo, "{}: {}", source, e.what());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kIo) throw;
    fail(ErrorKind::kIo, "{}: {}", source, e.what());
  }
}

Layout read_layout(const fs::path& dir) {
  if (!fs::is_directory(dir))
    fail(ErrorKind::kIo, "\"{}\" is not a sharded tensor folder", dir.string());
  const fs::path file = dir / "layout.json";
  const std::string text = read_file(file);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kIo, "{}: invalid JSON at byte {}", file.string(), e.byte);
  }
  return layout_from_json(json, file.string());
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

fs::path stage_folder(const fs::path& dir, const std::string& tag) {
  std::error_code ec;
  if (fs::exists(dir) &&
      !(fs::is_directory(dir) && (fs::is_empty(dir) || fs::exists(dir / "layout.json")))) {
    fail(ErrorKind::kIo, "refusing to replace \"{}\": it exists and is not a sharded tensor folder",
         dir.string());
  }
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::is_directory(parent)) {
    fail(ErrorKind::kIo, "cannot write \"{}\": folder \"{}\" does not exist", dir.string(),
         parent.string());
  }
  fs::path tmp = dir;
  tmp += tag;
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec))
    fail(ErrorKind::kIo, "cannot create \"{}\": {}", tmp.string(), ec.message());
  return tmp;
}

void commit_folder(const fs::path& staged, const fs::path& dir) {
  std::error_code ec;
  fs::path old = dir;
  old += fmt::format(".old-{}", ::getpid());
  const bool replacing = fs::exists(dir);
  if (replacing) fs::rename(dir, old, ec);
  if (!ec) fs::rename(staged, dir, ec);
  if (ec) {
    discard_folder(staged);
    fail(ErrorKind::kIo, "cannot move the new folder into \"{}\"", dir.string());
  }
  if (replacing) fs::remove_all(old, ec);
}

void discard_folder(const fs::path& staged) {
  std::error_code ignored;
  fs::remove_all(staged, ignored);
}

void write_sharded(const fs::path& dir, const Layout& layout, const std::vector<Tensor>& shards) {
  MESHFLOW_CHECK(shards.size() == layout.mesh.devices.size());
  const fs::path tmp = stage_folder(dir, fmt::format(".tmp-{}", ::getpid()));
  try {
    write_file_atomic(tmp / "layout.json", layout_to_json(layout).dump(2) + "\n");
    for (std::size_t i = 0; i < shards.size(); ++i)
      write_npy(tmp / shard_file_name(static_cast<int>(i)), shards[i]);
  } catch (...) {
    discard_folder(tmp);
    throw;
  }
  commit_folder(tmp, dir);
}

}  // namespace meshflow
