// Datasets: the model file's "data" object (DESIGN.md "Data, evaluation and tokenizers") read
// into plain values. A split is a token stream (1-d .npy files of uint16, int32 or int64 ids,
// llm.c .bin shards, or a list of them read as one stream) or named sample arrays (.npy files
// sharing dim 0). Reading a spec reads the files' headers only; the data stays on disk.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/core/dtype.h"
#include "meshflow/core/json_field.h"
#include "meshflow/core/shape.h"

namespace meshflow {

// How rows of the run map to units (DESIGN's orders).
enum class DataOrder { kShuffled, kSequential, kRandom };

// Returns "shuffled", "sequential" or "random"; parses them (nullopt for any other text).
std::string_view to_string(DataOrder order);
std::optional<DataOrder> parse_data_order(std::string_view text);

// One file of a token stream: `tokens` ids of `item_bytes` bytes each (2: uint16, 4: int32,
// 8: int64, little-endian) from byte `offset` on.
struct StreamFile {
  std::filesystem::path path;
  std::int64_t offset = 0;
  std::int64_t tokens = 0;
  int item_bytes = 0;
  bool operator==(const StreamFile&) const = default;
};

// One sample array: `shape[0]` samples of the trailing shape, from byte `offset` on.
struct SampleArray {
  std::filesystem::path path;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::int64_t offset = 0;
  bool operator==(const SampleArray&) const = default;
};

// A split: a token stream (`stream` non-empty) or sample arrays (`arrays` non-empty).
struct Split {
  std::vector<StreamFile> stream;
  std::map<std::string, SampleArray> arrays;
  bool is_stream() const { return !stream.empty(); }
  // Returns N: the stream's tokens or the arrays' samples.
  std::int64_t size() const;
  bool operator==(const Split&) const = default;
};

struct DataSpec {
  Split train;
  std::optional<Split> val;
  DataOrder order = DataOrder::kShuffled;
  std::uint32_t seed = 0;
  bool operator==(const DataSpec&) const = default;
};

// Returns the spec of the "data" object `f`; paths are relative to `base`. Throws Error naming
// the field or the file: a missing or unreadable path, a stream that is not 1-d of uint16, int32
// or int64, a .bin whose magic, version or count disagree with its size, sample arrays of
// different N, "order": "random" on sample arrays, a seed outside [0, 2^32).
DataSpec parse_data_spec(const JsonField& f, const std::filesystem::path& base);

// Returns a token stream of the files `paths` (.npy or llm.c .bin, by their first bytes), headers
// checked as parse_data_spec checks them.
std::vector<StreamFile> read_stream_files(const std::vector<std::filesystem::path>& paths);

// A data input of the model: a tensor whose "input" is {"data": name[, "shift": k]}.
struct DataInput {
  std::string tensor;
  std::string name;  // "window" on a token stream, else an array's name
  std::int64_t shift = 0;
  DType dtype = DType::kInt64;
  Shape shape;  // the global batch's: [B, S] for a window, [B, ...] for an array
  bool operator==(const DataInput&) const = default;
};

// Returns S, the tokens of a window input's row (the inputs' dim 1; 1 where they have none).
std::int64_t window_of(const std::vector<DataInput>& inputs);

// Returns the units W of `split` for inputs `inputs`: a stream of N tokens read in windows of S
// with largest shift K has ⌊(N − K) / S⌋; sample arrays have N.
std::int64_t units_of(const Split& split, const std::vector<DataInput>& inputs);

// Returns the number of window starts the random order draws from: N − S − K + 1 (at least 0).
std::int64_t random_starts_of(const Split& split, const std::vector<DataInput>& inputs);

// Checks `inputs` against `spec` and throws Error naming the tensor or field: no input, an
// unknown array or NAME, a window input not [B, S] of an integer dtype, inputs of different B,
// an array whose trailing shape or dtype differs from its input's, "shift" on sample arrays,
// a split with no unit (W = 0). `source` names the model file.
void check_data_inputs(const DataSpec& spec, const std::vector<DataInput>& inputs,
                       std::string_view source);

}  // namespace meshflow
