// Saving (every device its files, hashed as written; the leader commits by a rename), listing,
// verifying and matching checkpoints.
#include "meshflow/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include "meshflow/core/copy.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/sha256.h"
#include "meshflow/mesh/folder_io.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {

namespace fs = std::filesystem;

namespace {

// The slab a load reads a file's rows in (save's writes go in slabs of the same size).
constexpr std::int64_t kSlabBytes = std::int64_t{8} << 20;

// Returns k for a folder named "step-<k>" (k decimal, unpadded), none otherwise.
std::optional<int> step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (!name.starts_with("step-")) return std::nullopt;
  const std::string digits = name.substr(5);
  int k = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || k < 1 ||
      std::to_string(k) != digits)
    return std::nullopt;
  return k;
}

std::string shape_text(const TensorSpec& s) {
  return fmt::format("{} {}", to_string(s.dtype), to_string(s.shape));
}

}  // namespace

std::vector<Tensor> load_checkpoint(Communicator& world, const Checkpoint& c,
                                    const std::vector<LoadTarget>& targets,
                                    CheckpointLoadArea* area) {
  const DeviceId me = world.device();
  std::vector<Tensor> mine;
  std::vector<Tensor*> pointers;
  for (const LoadTarget& t : targets) {
    const bool held = find_device(t.layout.mesh, me).has_value();
    mine.push_back(held ? Tensor::uninitialized(t.layout.dtype, local_shape(t.layout, me))
                        : Tensor());
  }
  for (Tensor& t : mine) pointers.push_back(&t);
  const bool shared = area != nullptr && world.shares_memory();
  if (shared) {
    std::lock_guard lock(area->mu);
    area->shards[me] = pointers;
  }
  barrier(world);  // every device's shards are allocated (and published when shared)
  // The files in damaged_files' order; file j is this device's to verify when j % n == rank.
  const int n = world.size(), rank = world.rank();
  std::string damaged;
  int j = 0;
  std::vector<std::byte> slab;
  for (const auto& [name, t] : c.tensors) {
    for (const auto& [file, sha] : t.files) {
      if (j++ % n != rank) continue;
      const fs::path path = c.path / name / file;
      if (!fs::exists(path)) {
        damaged += fmt::format("{}: missing\n", path.string());
        continue;
      }
      if (!shared) {
        if (sha256_file(path) != sha)
          damaged += fmt::format("{}: its bytes do not match its sha256\n", path.string());
        continue;
      }
      // One read: each slab of whole rows read straight into the parts of the devices' shards
      // it holds (one scattered read; replicas copied after), then hashed there in file order.
      const File f = File::open_read(path);
      const std::int64_t size = f.size();
      NpyHeader h;
      try {
        h = read_npy_header(f);
      } catch (const Error&) {  // a damaged header: the digest says so
        if (sha256_file(path) != sha) {
          damaged += fmt::format("{}: its bytes do not match its sha256\n", path.string());
          continue;
        }
        throw;
      }
      const int index = std::stoi(file.substr(4));  // "rank<i>.npy"
      const Box held =
          shard_box(t.layout, t.layout.mesh.devices.at(static_cast<std::size_t>(index)));
      const auto es = static_cast<std::int64_t>(size_of(t.layout.dtype));
      Sha256 hash;
      std::vector<std::byte> head(static_cast<std::size_t>(h.data_offset));
      f.read_at(0, head);
      hash.update(head);
      const bool fits = h.shape == held.extent && h.dtype == t.layout.dtype &&
                        h.data_offset + numel(held.extent) * es == size;
      const std::int64_t rows = held.extent.empty() ? 1 : held.extent[0];
      const std::int64_t row_bytes = rows == 0 ? 0 : numel(held.extent) / rows * es;
      const std::int64_t per_slab =
          std::max<std::int64_t>(1, kSlabBytes / std::max<std::int64_t>(row_bytes, 1));
      struct Piece {
        std::int64_t at = 0;  // byte offset in the shard's data
        std::int64_t len = 0;
        std::byte* dst = nullptr;
      };
      for (std::int64_t r = 0; fits && r < rows; r += per_slab) {
        const std::int64_t count = std::min(per_slab, rows - r);
        Box part = held;  // the slab's rows of the global tensor
        if (!part.extent.empty()) {
          part.offset[0] += r;
          part.extent[0] = count;
        }
        std::vector<Piece> pieces;
        for (auto& [device, shards] : area->shards) {
          for (std::size_t k = 0; k < targets.size(); ++k) {
            if (targets[k].name != name || shards[k]->numel() == 0 ||
                !is_representative(targets[k].layout, device))
              continue;
            const Box want = shard_box(targets[k].layout, device);
            const Box both = intersect(want, part);
            if (numel(both) == 0) continue;
            // Runs contiguous in the file and in the shard.
            for (const Box& run : contiguous_runs(both, {held, want})) {
              pieces.push_back({*contiguous_offset(run, held) * es, numel(run.extent) * es,
                                shards[k]->bytes() + *contiguous_offset(run, want) * es});
            }
          }
        }
        std::sort(pieces.begin(), pieces.end(),
                  [](const Piece& a, const Piece& b) { return a.at < b.at; });
        // Bytes no device needs land in scratch (each gap its own part of it, since they are
        // hashed after the read), so the read covers the slab in order.
        const std::int64_t begin = r * row_bytes, stop = (r + count) * row_bytes;
        std::vector<Piece> all;
        std::int64_t at = begin, gaps = 0;
        for (const Piece& p : pieces) {
          if (p.at > at) {
            all.push_back({at, p.at - at, nullptr});
            gaps += p.at - at;
          }
          all.push_back(p);
          at = p.at + p.len;
        }
        if (at < stop) {
          all.push_back({at, stop - at, nullptr});
          gaps += stop - at;
        }
        slab.resize(static_cast<std::size_t>(gaps));
        std::vector<std::span<std::byte>> spans;
        std::int64_t scratch = 0;
        for (const Piece& p : all) {
          std::byte* to = p.dst;
          if (!to) {
            to = slab.data() + scratch;
            scratch += p.len;
          }
          spans.emplace_back(to, static_cast<std::size_t>(p.len));
        }
        f.read_scattered(h.data_offset + begin, spans);
        for (const std::span<std::byte>& sp : spans) hash.update(sp);
      }
      if (!fits || hash.hex() != sha)
        damaged += fmt::format("{}: its bytes do not match its sha256\n", path.string());
    }
  }
  for (const std::string& theirs : all_gather_strings(world, damaged)) {
    if (!theirs.empty())
      throw Error(ErrorKind::kIo, theirs.substr(0, theirs.find('\n')), ErrorScope::kEveryDevice);
  }
  if (shared) {
    // Every representative's shard is complete (the gather above ordered it): replicas copy.
    for (std::size_t k = 0; k < targets.size(); ++k) {
      if (mine[k].numel() == 0 || is_representative(targets[k].layout, me)) continue;
      const Tensor& from = *area->shards.at(*replica_reference(targets[k].layout, me))[k];
      std::memcpy(mine[k].bytes(), from.bytes(), from.nbytes());
    }
    barrier(world);  // no device hands its shards on while a replica still copies from them
  }
  if (!shared) {
    for (std::size_t k = 0; k < targets.size(); ++k) {
      if (mine[k].numel() == 0 && !find_device(targets[k].layout.mesh, me)) continue;
      const CheckpointTensor& t = c.tensors.at(targets[k].name);
      mine[k] =
          read_folder_box(c.path / targets[k].name, t.layout, shard_box(targets[k].layout, me));
    }
  }
  return mine;
}

std::vector<fs::path> complete_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto k = step_of(entry.path());
    if (k && fs::is_regular_file(entry.path() / "checkpoint.json"))
      found.emplace_back(*k, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [k, p] : found) out.push_back(std::move(p));
  return out;
}

Checkpoint read_checkpoint(const fs::path& path) {
  const fs::path file = path / "checkpoint.json";
  Checkpoint c;
  c.path = path;
  try {
    const nlohmann::json doc = nlohmann::json::parse(read_file(file));
    c.step = doc.at("step").get<int>();
    c.optimizer = doc.at("optimizer");
    if (doc.contains("data")) c.data = doc.at("data");
    for (const auto& [name, t] : doc.at("tensors").items()) {
      CheckpointTensor ct{.layout = layout_from_json(t.at("layout"), file.string())};
      for (const auto& [f, sha] : t.at("files").items()) {
        // A file of the i-th device of the tensor's mesh.
        int i = -1;
        const bool named = f.starts_with("rank") && f.ends_with(".npy") &&
                           std::from_chars(f.data() + 4, f.data() + f.size() - 4, i).ptr ==
                               f.data() + f.size() - 4;
        if (!named || i < 0 || i >= size(ct.layout.mesh) || f != shard_file_name(i)) {
          fail(ErrorKind::kIo,
               "tensor \"{}\" lists file \"{}\", which no device of its mesh writes", name, f);
        }
        ct.files[f] = sha.get<std::string>();
      }
      c.tensors[name] = std::move(ct);
    }
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kIo) throw;
    fail(ErrorKind::kIo, "{}: {}", file.string(), e.what());
  } catch (const std::exception& e) {
    fail(ErrorKind::kIo, "{}: not a checkpoint description: {}", file.string(), e.what());
  }
  return c;
}

fs::path resume_path(const fs::path& given) {
  if (fs::is_regular_file(given / "checkpoint.json")) return given;
  if (step_of(given) && !fs::exists(given))
    fail(ErrorKind::kIo, "--resume \"{}\": no such checkpoint", given.string());
  const std::vector<fs::path> complete = complete_checkpoints(given);
  if (complete.empty())
    fail(ErrorKind::kIo, "--resume \"{}\": no complete checkpoint in it", given.string());
  return complete.back();
}

std::vector<std::string> damaged_files(const Checkpoint& c, const std::function<bool(int)>& only) {
  std::vector<std::string> damaged;
  int index = 0;
  for (const auto& [name, t] : c.tensors) {
    for (const auto& [file, sha] : t.files) {
      if (only && !only(index++)) continue;
      const fs::path path = c.path / name / file;
      if (!fs::exists(path)) {
        damaged.push_back(fmt::format("{}: missing", path.string()));
      } else if (sha256_file(path) != sha) {
        damaged.push_back(fmt::format("{}: its bytes do not match its sha256", path.string()));
      }
    }
  }
  return damaged;
}

void check_checkpoint_matches(const Checkpoint& c,
                              const std::map<std::string, TensorSpec>& expected,
                              OptimizerKind kind) {
  const std::string saved_kind = c.optimizer.value("kind", "");
  if (saved_kind != to_string(kind)) {
    fail(ErrorKind::kInvalidArgument,
         "{} was saved with --optimizer {}, not {}: resume it with --optimizer {}", c.path.string(),
         saved_kind, to_string(kind), saved_kind);
  }
  std::vector<std::string> lacking, extra;
  for (const auto& [name, spec] : expected)
    if (!c.tensors.count(name)) lacking.push_back(name);
  for (const auto& [name, t] : c.tensors)
    if (!expected.count(name)) extra.push_back(name);
  if (!lacking.empty()) {
    fail(ErrorKind::kInvalidArgument, "{} lacks tensors the model has: {}", c.path.string(),
         fmt::join(lacking, ", "));
  }
  if (!extra.empty()) {
    fail(ErrorKind::kInvalidArgument, "{} holds tensors the model lacks: {}", c.path.string(),
         fmt::join(extra, ", "));
  }
  for (const auto& [name, spec] : expected) {
    const Layout& l = c.tensors.at(name).layout;
    const TensorSpec saved{.shape = l.shape, .dtype = l.dtype};
    if (!(saved == spec)) {
      fail(ErrorKind::kInvalidArgument, "tensor \"{}\": {} holds {} but the model says {}", name,
           c.path.string(), shape_text(saved), shape_text(spec));
    }
  }
}

OptimizerOptions resumed_defaults(const Checkpoint& c, const OptimizerOptions& given,
                                  const OptimizerOptions& file_defaults, OptionStyle style) {
  const nlohmann::json& o = c.optimizer;
  const std::string saved = o.value("kind", "");
  if (given.kind && to_string(*given.kind) != saved) {
    fail(ErrorKind::kInvalidArgument,
         "{} {}: {} was saved with {} (a resumed run keeps its optimizer)",
         style == OptionStyle::kFlag ? "--optimizer" : "optimizer=", to_string(*given.kind),
         c.path.string(), saved);
  }
  OptimizerOptions out;
  auto number = [&](const char* key) -> std::optional<double> {
    if (!o.contains(key) || o.at(key).is_null()) return std::nullopt;
    return o.at(key).get<double>();
  };
  if (o.contains("kind"))
    out.kind = o.at("kind") == "adamw" ? OptimizerKind::kAdamW : OptimizerKind::kSgd;
  out.lr = number("lr");
  out.momentum = number("momentum");
  out.eps = number("eps");
  out.weight_decay = number("weight_decay");
  out.clip_grad_norm = number("clip_grad_norm");
  if (o.contains("betas"))
    out.betas = std::pair{o["betas"][0].get<double>(), o["betas"][1].get<double>()};
  if (o.contains("warmup_steps")) out.warmup_steps = o.at("warmup_steps").get<int>();
  if (o.contains("decay")) out.decay = parse_lr_decay(o.at("decay").get<std::string>());
  if (o.contains("decay_steps") && !o.at("decay_steps").is_null() && out.decay != LrDecay::kNone)
    out.decay_steps = o.at("decay_steps").get<int>();
  // The model file's fields of the same optimizer fill what the checkpoint lacks.
  const OptimizerOptions& f = file_defaults;
  if (!f.kind || f.kind == out.kind) {
    if (!out.lr) out.lr = f.lr;
    if (!out.momentum) out.momentum = f.momentum;
    if (!out.eps) out.eps = f.eps;
    if (!out.weight_decay) out.weight_decay = f.weight_decay;
    if (!out.betas) out.betas = f.betas;
  }
  return out;
}

nlohmann::json list_checkpoints(const fs::path& dir, bool verify) {
  if (!fs::is_directory(dir)) fail(ErrorKind::kIo, "\"{}\": no such folder", dir.string());
  nlohmann::json list = nlohmann::json::array();
  for (const fs::path& p : complete_checkpoints(dir)) {
    const Checkpoint c = read_checkpoint(p);
    std::int64_t bytes = 0;
    nlohmann::json tensors = nlohmann::json::object();
    for (const auto& [name, t] : c.tensors) {
      tensors[name] = {{"shape", t.layout.shape},
                       {"dtype", std::string(to_string(t.layout.dtype))},
                       {"layout", layout_to_json(t.layout)}};
      for (const auto& [file, sha] : t.files) {
        std::error_code ec;
        const auto size = fs::file_size(p / name / file, ec);
        if (!ec) bytes += static_cast<std::int64_t>(size);
      }
    }
    nlohmann::json verified = nullptr;
    if (verify) verified = damaged_files(c).empty();
    list.push_back({{"step", c.step},
                    {"path", p.string()},
                    {"bytes", bytes},
                    {"tensors", tensors},
                    {"verified", verified}});
  }
  return {{"checkpoints", list}};
}

}  // namespace meshflow
