// Model files: DESIGN.md's "Models" JSON (meshes, tensors, nodes, loss, outputs) read into a
// Pcg through the builder functions of graph/pcg.h, so a file and the C++ API build the same
// graph. Paths inside the file are relative to it. Every error is one line naming the file and
// the node, tensor or field at fault.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/graph/pcg.h"

namespace meshflow {

struct Model {
  Pcg pcg;  // Stage::kBuilt
  std::map<std::string, DeviceMesh> meshes;
  // The optional "train" object: defaults for `train`'s options (read and checked by
  // train/optimizer.h's train_defaults_from_json); null when the file has none.
  nlohmann::json train;
  // The optional "data" object (datasets, read by train/data_feed.h); null when the file has
  // none. `base` is the folder its paths are relative to.
  nlohmann::json data;
  std::filesystem::path base;
  // The optional "generate" object (DESIGN "Generation"): kept as written.
  nlohmann::json generate;
  std::string source;  // the file's name, for messages about its contents
};

// Returns the model in file `path`, its data files' headers checked against it.
Model load_model(const std::filesystem::path& path);

// Returns how many devices `model`'s meshes and its nodes' pinned layouts and meshes span
// together (at least 1).
int model_device_count(const Model& model);

// Returns the model `text` describes; `base` is the folder relative paths start from, `source`
// names the text in messages.
Model parse_model(std::string_view text, const std::filesystem::path& base,
                  std::string_view source);

}  // namespace meshflow
