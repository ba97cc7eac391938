// Saving (every device its files, hashed as written; the leader commits by a rename), listing,
// verifying and matching checkpoints.
#include "meshflow/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/sha256.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kSlabBytes = std::int64_t{8} << 20;

// Writes `text` to `path` durably.
void write_durable(const fs::path& path, const std::string& text) {
  const File f = File::create(path);
  f.write_at(0, std::as_bytes(std::span<const char>(text.data(), text.size())));
  f.sync();
}

// Writes `t` as a .npy file at `path` with positioned writes, hashing each slab as it goes, and
// makes it durable; returns its sha256.
std::string write_hashed(const fs::path& path, const Tensor& t) {
  const File f = File::create(path);
  Sha256 h;
  const std::string header = encode_npy_header(t.dtype(), t.shape());
  const auto head = std::as_bytes(std::span<const char>(header.data(), header.size()));
  h.update(head);
  f.write_at(0, head);
  const std::int64_t size = static_cast<std::int64_t>(t.nbytes());
  for (std::int64_t at = 0; at < size; at += kSlabBytes) {
    const std::span<const std::byte> slab(
        t.bytes() + at, static_cast<std::size_t>(std::min(kSlabBytes, size - at)));
    h.update(slab);
    f.write_at(static_cast<std::int64_t>(header.size()) + at, slab);
  }
  f.sync();
  return h.hex();
}

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

void save_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                     int step, const nlohmann::json& optimizer,
                     const std::vector<SavedTensor>& tensors) {
  const fs::path staged = options.dir / fmt::format(".step-{}.partial", step);
  const fs::path target = options.dir / fmt::format("step-{}", step);
  const DeviceId me = world.device();
  const bool leading = me == leader;
  // The leader stages the folders (clearing what a killed writer left), then every device
  // writes its files; a failure on any device reaches every device at the gather below.
  std::string error;
  if (leading) {
    try {
      fs::create_directories(options.dir);
      // What killed writers left: checkpoints half-written or half-deleted.
      for (const auto& entry : fs::directory_iterator(options.dir))
        if (entry.path().filename().string().starts_with(".step-")) fs::remove_all(entry.path());
      fs::create_directories(staged);
      for (const SavedTensor& t : tensors) {
        fs::create_directory(staged / t.name);
        write_durable(staged / t.name / "layout.json", layout_to_json(t.layout).dump(2) + "\n");
      }
    } catch (const std::exception& e) {
      error = fmt::format("cannot stage checkpoint {}: {}", target.string(), e.what());
    }
  }
  error = broadcast_string(world, error, rank_of(world, leader));
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
  std::string records;  // "<tensor>\t<file>\t<sha256>\n" per file this device wrote
  try {
    for (const SavedTensor& t : tensors) {
      if (!t.shard || !is_representative(t.layout, me)) continue;
      const std::string file = shard_file_name(*find_device(t.layout.mesh, me));
      records +=
          fmt::format("{}\t{}\t{}\n", t.name, file, write_hashed(staged / t.name / file, *t.shard));
    }
  } catch (const std::exception& e) {
    records = fmt::format("!{}", e.what());
  }
  // Every device's files are durable once it reports them.
  const std::vector<std::string> all = all_gather_strings(world, records);
  for (const std::string& r : all)
    if (r.starts_with("!")) fail(ErrorKind::kIo, "checkpoint {}: {}", step, r.substr(1));
  if (leading) {
    try {
      nlohmann::json out_tensors = nlohmann::json::object();
      for (const SavedTensor& t : tensors)
        out_tensors[t.name] = {{"layout", layout_to_json(t.layout)},
                               {"files", nlohmann::json::object()}};
      for (const std::string& r : all) {
        std::size_t at = 0;
        while (at < r.size()) {
          const std::size_t end = r.find('\n', at);
          const std::string line = r.substr(at, end - at);
          at = end + 1;
          const std::size_t a = line.find('\t'), b = line.find('\t', a + 1);
          out_tensors[line.substr(0, a)]["files"][line.substr(a + 1, b - a - 1)] =
              line.substr(b + 1);
        }
      }
      for (const SavedTensor& t : tensors) sync_directory(staged / t.name);
      const nlohmann::json doc = {
          {"step", step}, {"optimizer", optimizer}, {"tensors", out_tensors}};
      write_durable(staged / "checkpoint.json", doc.dump(2) + "\n");
      sync_directory(staged);
      publish(staged, target);
      sync_directory(options.dir);
      if (options.keep_last > 0) {
        // Each old checkpoint leaves the listing by one rename before its files go, so a kill
        // in between leaves no half-deleted step-<k>.
        std::vector<fs::path> complete = complete_checkpoints(options.dir);
        for (std::size_t i = 0; i + static_cast<std::size_t>(options.keep_last) < complete.size();
             ++i) {
          const fs::path doomed =
              options.dir / ("." + complete[i].filename().string() + ".deleting");
          fs::remove_all(doomed);
          fs::rename(complete[i], doomed);
          sync_directory(options.dir);
          fs::remove_all(doomed);
        }
      }
    } catch (const std::exception& e) {
      error = fmt::format("cannot commit checkpoint {}: {}", target.string(), e.what());
    }
  }
  error = broadcast_string(world, error, rank_of(world, leader));
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
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
    for (const auto& [name, t] : doc.at("tensors").items()) {
      CheckpointTensor ct{.layout = layout_from_json(t.at("layout"), file.string())};
      for (const auto& [f, sha] : t.at("files").items()) ct.files[f] = sha.get<std::string>();
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
