// The on-disk form of a sharded tensor: a folder with layout.json and rank<i>.npy per mesh
// device (row-major mesh order). Written to a temporary sibling and renamed into place.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/mesh/layout.h"

namespace meshflow {

// Returns the layout.json object: {"mesh": {"shape", "devices", "names"}, "placements", "shape",
// "dtype"}.
nlohmann::json layout_to_json(const Layout& layout);

// Returns the layout the JSON describes; throws Error naming `source` and the bad field.
Layout layout_from_json(const nlohmann::json& json, std::string_view source);

// A sharded tensor as read from disk.
struct ShardedTensor {
  Layout layout;
  std::vector<Tensor> shards;  // one per mesh device, row-major mesh order
};

// Returns the layout and shards in folder `dir`; throws Error(kIo) naming the file at fault.
ShardedTensor read_sharded(const std::filesystem::path& dir);

// Returns the layout in `dir`/layout.json.
Layout read_layout(const std::filesystem::path& dir);

// Writes `layout` and `shards` as folder `dir` by the atomic output protocol (core/file.h): the
// path holds the complete old folder or the complete new one at every instant. An existing
// sharded folder (or empty folder) at `dir` is replaced; anything else there is an error.
void write_sharded(const std::filesystem::path& dir, const Layout& layout,
                   const std::vector<Tensor>& shards);

// Returns the shard of the `mesh_index`-th device stored in `dir`, checked against `layout`.
Tensor read_shard(const std::filesystem::path& dir, const Layout& layout, int mesh_index);

// Writing a folder in stages, for writers spread over devices or streams: stage_folder checks
// that `dir` may be replaced, clears what killed writers left, and creates an empty staging
// folder (returned); files are written into it; commit_folder publishes it as `dir`, and
// discard (core/file.h) removes it after a failure.
std::filesystem::path stage_folder(const std::filesystem::path& dir);
// As stage_folder, for a folder whose entries are sharded folders (`meshflow run --save DIR`):
// an existing `dir` is replaced only when it is empty or holds nothing but sharded folders.
std::filesystem::path stage_folder_of_folders(const std::filesystem::path& dir);
void commit_folder(const std::filesystem::path& staged, const std::filesystem::path& dir);

// Returns "rank<i>.npy".
std::string shard_file_name(int mesh_index);

}  // namespace meshflow
