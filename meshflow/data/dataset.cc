// Reading the "data" object: each file's header checked against DESIGN's formats, each error
// naming the field or the file.
#include "meshflow/data/dataset.h"

#include <fmt/format.h>

#include <array>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// llm.c's token shard header: 256 little-endian int32, of which the first three are the magic,
// the version and the token count; uint16 tokens follow.
constexpr std::int32_t kBinMagic = 20240520;
constexpr std::int32_t kBinVersion = 1;
constexpr std::int64_t kBinHeaderBytes = 256 * 4;

constexpr std::array<std::string_view, 3> kTokenDescrs = {"<u2", "<i4", "<i8"};

StreamFile read_bin(const File& file) {
  const std::string name = file.path().string();
  const std::int64_t size = file.size();
  if (size < kBinHeaderBytes) {
    fail(ErrorKind::kIo,
         "{}: not a .npy file nor an llm.c .bin shard ({} bytes, a .bin header is {})", name, size,
         kBinHeaderBytes);
  }
  std::array<std::int32_t, 3> head{};
  file.read_at(0, std::as_writable_bytes(std::span(head)));
  if (head[0] != kBinMagic) {
    fail(ErrorKind::kIo, "{}: not a .npy file nor an llm.c .bin shard (magic {}, expected {})",
         name, head[0], kBinMagic);
  }
  if (head[1] != kBinVersion) {
    fail(ErrorKind::kIo, "{}: llm.c .bin version {} (meshflow reads version {})", name, head[1],
         kBinVersion);
  }
  const std::int64_t count = head[2];
  if (count < 0 || kBinHeaderBytes + 2 * count != size) {
    fail(ErrorKind::kIo,
         "{}: llm.c .bin header counts {} tokens but the file holds {} bytes of tokens", name,
         count, size - kBinHeaderBytes);
  }
  return {.path = file.path(), .offset = kBinHeaderBytes, .tokens = count, .item_bytes = 2};
}

StreamFile read_stream_file(const fs::path& path) {
  const File file = File::open_read(path);
  std::array<char, 6> magic{};
  if (file.size() >= 6) file.read_at(0, std::as_writable_bytes(std::span(magic)));
  if (std::string_view(magic.data(), magic.size()) != "\x93NUMPY") return read_bin(file);
  const NpyRawHeader h = read_npy_raw_header(file, kTokenDescrs);
  if (h.shape.size() != 1) {
    fail(ErrorKind::kIo, "{}: a token stream is 1-d, this array is {}", path.string(),
         to_string(h.shape));
  }
  return {.path = path,
          .offset = h.data_offset,
          .tokens = h.shape[0],
          .item_bytes = static_cast<int>(h.item_bytes)};
}

std::vector<fs::path> paths_of(const JsonField& f, const fs::path& base) {
  std::vector<fs::path> out;
  if (f.value().is_string()) return {base / f.as_string()};
  if (!f.value().is_array() || f.size() == 0)
    f.reject("must be a path, a non-empty list of paths or an object of named .npy paths");
  for (std::size_t i = 0; i < f.size(); ++i) out.push_back(base / f.at(i).as_string());
  return out;
}

Split read_split(const JsonField& f, const fs::path& base) {
  Split s;
  try {
    if (f.value().is_object()) {
      if (f.value().empty()) f.reject("must name at least one sample array");
      std::int64_t n = -1;
      std::string first;
      for (const auto& [name, value] : f.value().items()) {
        const fs::path path = base / f.member(name).as_string();
        const NpyHeader h = read_npy_header(File::open_read(path));
        if (h.shape.empty()) {
          fail(ErrorKind::kIo, "{}: a sample array has a dim 0 of samples, this one is a scalar",
               path.string());
        }
        if (n >= 0 && h.shape[0] != n) {
          f.reject(fmt::format("holds sample arrays of different N: \"{}\" has {}, \"{}\" has {}",
                               first, n, name, h.shape[0]));
        }
        if (n < 0) first = name;
        n = h.shape[0];
        s.arrays[name] = {
            .path = path, .dtype = h.dtype, .shape = h.shape, .offset = h.data_offset};
      }
      return s;
    }
    s.stream = read_stream_files(paths_of(f, base));
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(f.name()) != std::string_view::npos) throw;
    fail(e.kind(), "data split {}: {}", f.name(), e.what());
  }
  return s;
}

}  // namespace

std::string_view to_string(DataOrder order) {
  switch (order) {
    case DataOrder::kShuffled:
      return "shuffled";
    case DataOrder::kSequential:
      return "sequential";
    case DataOrder::kRandom:
      return "random";
  }
  return "?";
}

std::optional<DataOrder> parse_data_order(std::string_view text) {
  for (DataOrder o : {DataOrder::kShuffled, DataOrder::kSequential, DataOrder::kRandom})
    if (text == to_string(o)) return o;
  return std::nullopt;
}

std::int64_t Split::size() const {
  if (is_stream()) {
    std::int64_t n = 0;
    for (const StreamFile& f : stream) n += f.tokens;
    return n;
  }
  return arrays.empty() ? 0 : arrays.begin()->second.shape[0];
}

std::vector<StreamFile> read_stream_files(const std::vector<fs::path>& paths) {
  std::vector<StreamFile> out;
  for (const fs::path& p : paths) out.push_back(read_stream_file(p));
  return out;
}

DataSpec parse_data_spec(const JsonField& f, const fs::path& base) {
  if (!f.value().is_object())
    f.reject("must be an object with \"train\" (and \"val\", \"order\", \"seed\")");
  for (const auto& [key, value] : f.value().items()) {
    if (key != "train" && key != "val" && key != "order" && key != "seed") {
      f.reject(fmt::format("has unknown field \"{}\" (allowed: train, val, order, seed)", key));
    }
  }
  DataSpec spec;
  spec.train = read_split(f.member("train"), base);
  if (auto v = f.find("val")) spec.val = read_split(*v, base);
  if (auto o = f.find("order")) {
    const auto order = parse_data_order(o->as_string());
    if (!order) o->reject("must be \"shuffled\", \"sequential\" or \"random\"");
    spec.order = *order;
    if (spec.order == DataOrder::kRandom && !spec.train.is_stream())
      o->reject("\"random\" applies to token streams only, not to sample arrays");
  }
  if (auto s = f.find("seed"))
    spec.seed = static_cast<std::uint32_t>(s->as_int(0, (std::int64_t{1} << 32) - 1));
  if (spec.val && spec.val->is_stream() != spec.train.is_stream())
    f.member("val").reject("must be of the train split's kind (a token stream or sample arrays)");
  return spec;
}

namespace {

// Returns "float32 [2, 3]".
std::string spec_text(DType dtype, const Shape& shape) {
  return fmt::format("{} [{}]", to_string(dtype), fmt::join(shape, ", "));
}

std::int64_t largest_shift(const std::vector<DataInput>& inputs) {
  std::int64_t k = 0;
  for (const DataInput& in : inputs) k = std::max(k, in.shift);
  return k;
}

}  // namespace

std::int64_t window_of(const std::vector<DataInput>& inputs) {
  return inputs.empty() || inputs[0].shape.size() < 2 ? 1 : inputs[0].shape[1];
}

std::int64_t units_of(const Split& split, const std::vector<DataInput>& inputs) {
  if (!split.is_stream()) return split.size();
  const std::int64_t n = split.size() - largest_shift(inputs);
  return n <= 0 ? 0 : n / window_of(inputs);
}

std::int64_t random_starts_of(const Split& split, const std::vector<DataInput>& inputs) {
  return std::max<std::int64_t>(0, split.size() - window_of(inputs) - largest_shift(inputs) + 1);
}

void check_data_inputs(const DataSpec& spec, const std::vector<DataInput>& inputs,
                       std::string_view source) {
  if (inputs.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "{}: \"data\" is given but no tensor reads it (an input {{\"data\": \"window\"}} or "
         "{{\"data\": \"<array>\"}})",
         source);
  }
  const std::int64_t b = inputs[0].shape.empty() ? 0 : inputs[0].shape[0];
  for (const DataInput& in : inputs) {
    auto bad = [&](std::string what) {
      fail(ErrorKind::kInvalidArgument, "{}: tensor \"{}\": {}", source, in.tensor, what);
    };
    if (in.shape.empty() || in.shape[0] != b) {
      bad(fmt::format("data inputs share one batch size B: \"{}\" has {}, this one is [{}]",
                      inputs[0].tensor, b, fmt::join(in.shape, ", ")));
    }
    if (spec.train.is_stream()) {
      if (in.name != "window")
        bad(fmt::format("reads \"{}\", but the data is a token stream (read it as \"window\")",
                        in.name));
      if (in.shape.size() != 2 || (in.dtype != DType::kInt32 && in.dtype != DType::kInt64))
        bad(fmt::format("a window input is [B, S] of int32 or int64, not {}",
                        spec_text(in.dtype, in.shape)));
      if (in.shape != inputs[0].shape)
        bad(fmt::format("window inputs share one [B, S]: \"{}\" is [{}], this one [{}]",
                        inputs[0].tensor, fmt::join(inputs[0].shape, ", "),
                        fmt::join(in.shape, ", ")));
    } else {
      if (in.shift != 0) bad("\"shift\" applies to token streams only, not to sample arrays");
      auto it = spec.train.arrays.find(in.name);
      if (it == spec.train.arrays.end()) {
        std::vector<std::string> names;
        for (const auto& [k, v] : spec.train.arrays) names.push_back(k);
        bad(fmt::format("reads array \"{}\", which the data lacks (it has: {})", in.name,
                        fmt::join(names, ", ")));
      }
      for (const Split* split : {&spec.train, spec.val ? &*spec.val : nullptr}) {
        if (!split) continue;
        auto a = split->arrays.find(in.name);
        if (a == split->arrays.end()) {
          bad(fmt::format("reads array \"{}\", which the val split lacks", in.name));
        }
        const Shape trailing(a->second.shape.begin() + 1, a->second.shape.end());
        const Shape want(in.shape.begin() + 1, in.shape.end());
        if (trailing != want || a->second.dtype != in.dtype) {
          bad(fmt::format("\"{}\" holds samples of {} but the input's are {}",
                          a->second.path.string(), spec_text(a->second.dtype, trailing),
                          spec_text(in.dtype, want)));
        }
      }
    }
  }
  for (const Split* split : {&spec.train, spec.val ? &*spec.val : nullptr}) {
    if (split && units_of(*split, inputs) == 0) {
      fail(ErrorKind::kInvalidArgument,
           "{}: the {} split has no unit: {} {} for windows of {} tokens (shift {})", source,
           split == &spec.train ? "train" : "val", split->size(),
           split->is_stream() ? "tokens" : "samples", window_of(inputs), largest_shift(inputs));
    }
  }
}

}  // namespace meshflow
