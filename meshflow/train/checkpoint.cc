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

#include "meshflow/core/clock.h"
#include "meshflow/core/copy.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/sha256.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/mesh/folder_io.h"
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

// Writes `t` as a .npy file `f` with positioned writes, hashing each slab as it goes; returns
// its sha256 (the caller syncs). Unbuffered (`f.direct()`, and `t`'s memory on a disk block,
// as a large tensor's is): the header is padded to a block and the data goes from `t` to the
// disk with no page-cache copy, the last partial block through a zero-padded block, then the
// file is cut to its size. Otherwise each slab's write-back starts as it is written.
std::string write_hashed(const File& f, const Tensor& t) {
  const std::int64_t size = static_cast<std::int64_t>(t.nbytes());
  const bool direct =
      f.direct() && reinterpret_cast<std::uintptr_t>(t.bytes()) % kDirectAlignment == 0;
  Sha256 h;
  const std::string header =
      encode_npy_header(t.dtype(), t.shape(), direct ? kDirectAlignment : 64);
  const auto head = std::as_bytes(std::span<const char>(header.data(), header.size()));
  h.update(head);
  const auto data_at = static_cast<std::int64_t>(header.size());
  // One block-aligned buffer for the header and the tail (unbuffered writes need both aligned).
  auto* block = static_cast<std::byte*>(std::aligned_alloc(kDirectAlignment, kDirectAlignment));
  MESHFLOW_CHECK(block != nullptr);
  const std::unique_ptr<std::byte, decltype(&std::free)> hold(block, &std::free);
  if (direct) {
    std::memcpy(block, head.data(), head.size());
    f.write_at(0, {block, static_cast<std::size_t>(kDirectAlignment)});
  } else {
    f.write_at(0, head);
  }
  for (std::int64_t at = 0; at < size; at += kSlabBytes) {
    const std::int64_t len = std::min(kSlabBytes, size - at);
    const std::span<const std::byte> slab(t.bytes() + at, static_cast<std::size_t>(len));
    h.update(slab);
    if (!direct) {
      f.write_at(data_at + at, slab);
      f.start_writeback(data_at + at, len);
      continue;
    }
    const std::int64_t whole = len / kDirectAlignment * kDirectAlignment;
    if (whole > 0) f.write_at(data_at + at, slab.first(static_cast<std::size_t>(whole)));
    if (whole < len) {  // the last partial block
      std::memset(block, 0, static_cast<std::size_t>(kDirectAlignment));
      std::memcpy(block, slab.data() + whole, static_cast<std::size_t>(len - whole));
      f.write_at(data_at + at + whole, {block, static_cast<std::size_t>(kDirectAlignment)});
      f.truncate(data_at + size);
    }
  }
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

namespace {

fs::path staged_path(const CheckpointOptions& options, int step) {
  return options.dir / fmt::format(".step-{}.partial", step);
}

// The leader stages checkpoint `step`'s folders (clearing what a killed writer left); a failure
// reaches every device. The folders' layout.json files are the leader's writer's
// (write_device_files).
void stage_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                      int step, const std::vector<SavedTensor>& tensors) {
  const fs::path staged = staged_path(options, step);
  std::string error;
  if (world.device() == leader) {
    try {
      fs::create_directories(options.dir);
      // What killed writers left: checkpoints half-written or half-deleted.
      for (const auto& entry : fs::directory_iterator(options.dir))
        if (entry.path().filename().string().starts_with(".step-")) fs::remove_all(entry.path());
      fs::create_directories(staged);
      for (const SavedTensor& t : tensors) fs::create_directory(staged / t.name);
    } catch (const std::exception& e) {
      error = fmt::format("cannot stage checkpoint {}: {}",
                          (options.dir / fmt::format("step-{}", step)).string(), e.what());
    }
  }
  error = broadcast_string(world, error, rank_of(world, leader));
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
}

// The leader drops the complete checkpoints beyond the newest keep_last. Each leaves the listing
// by one rename before its files go, so a kill in between leaves no half-deleted step-<k>.
void drop_old_checkpoints(const CheckpointOptions& options) {
  if (options.keep_last <= 0) return;
  std::vector<fs::path> complete = complete_checkpoints(options.dir);
  for (std::size_t i = 0; i + static_cast<std::size_t>(options.keep_last) < complete.size(); ++i) {
    const fs::path doomed = options.dir / ("." + complete[i].filename().string() + ".deleting");
    fs::remove_all(doomed);
    fs::rename(complete[i], doomed);
    sync_directory(options.dir);
    fs::remove_all(doomed);
  }
}

// Writes and syncs `me`'s files of `tensors` into the staged folder (the leader: and every
// tensor's layout.json); returns
// "<tensor>\t<file>\t<sha256>\n" per file, or "!<error>". No communication.
std::string write_device_files(const fs::path& staged, DeviceId me, bool leading,
                               const std::vector<SavedTensor>& tensors) {
  std::string records;
  try {
    if (leading) {
      for (const SavedTensor& t : tensors)
        write_durable(staged / t.name / "layout.json", layout_to_json(t.layout).dump(2) + "\n");
    }
    // Every file written (the disk writing back behind the hashing), then every one synced.
    std::vector<File> written;
    for (const SavedTensor& t : tensors) {
      if (!t.shard || !is_representative(t.layout, me)) continue;
      const std::string file = shard_file_name(*find_device(t.layout.mesh, me));
      // Unbuffered where the shard is large and its memory on a disk block.
      const bool unbuffered =
          t.shard->nbytes() >= (std::size_t{1} << 20) &&
          reinterpret_cast<std::uintptr_t>(t.shard->bytes()) % kDirectAlignment == 0;
      const fs::path path = staged / t.name / file;
      written.push_back(unbuffered ? File::create_direct(path) : File::create(path));
      records += fmt::format("{}\t{}\t{}\n", t.name, file, write_hashed(written.back(), *t.shard));
    }
    for (const File& f : written) f.sync();
  } catch (const std::exception& e) {
    records = fmt::format("!{}", e.what());
  }
  return records;
}

// Every device's records gathered (its files are durable once it reports them); the leader
// writes checkpoint.json and commits by a rename (and with `drop_old` drops the oldest beyond
// keep_last).
void commit_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                       int step, const nlohmann::json& optimizer,
                       const std::vector<std::pair<std::string, Layout>>& tensors,
                       const nlohmann::json& data, const std::string& records, bool drop_old) {
  const fs::path staged = staged_path(options, step);
  const fs::path target = options.dir / fmt::format("step-{}", step);
  const std::vector<std::string> all = all_gather_strings(world, records);
  for (const std::string& r : all)
    if (r.starts_with("!")) fail(ErrorKind::kIo, "checkpoint {}: {}", step, r.substr(1));
  std::string error;
  if (world.device() == leader) {
    try {
      nlohmann::json out_tensors = nlohmann::json::object();
      for (const auto& [name, layout] : tensors)
        out_tensors[name] = {{"layout", layout_to_json(layout)},
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
      for (const auto& [name, layout] : tensors) sync_directory(staged / name);
      nlohmann::json doc = {{"step", step}, {"optimizer", optimizer}, {"tensors", out_tensors}};
      if (!data.is_null()) doc["data"] = data;
      write_durable(staged / "checkpoint.json", doc.dump(2) + "\n");
      sync_directory(staged);
      publish(staged, target);
      sync_directory(options.dir);
      if (drop_old) drop_old_checkpoints(options);
    } catch (const std::exception& e) {
      error = fmt::format("cannot commit checkpoint {}: {}", target.string(), e.what());
    }
  }
  error = broadcast_string(world, error, rank_of(world, leader));
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
}

std::vector<std::pair<std::string, Layout>> layouts_of(const std::vector<SavedTensor>& tensors) {
  std::vector<std::pair<std::string, Layout>> out;
  for (const SavedTensor& t : tensors) out.emplace_back(t.name, t.layout);
  return out;
}

}  // namespace

void save_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                     int step, const nlohmann::json& optimizer,
                     const std::vector<SavedTensor>& tensors, const nlohmann::json& data) {
  stage_checkpoint(world, leader, options, step, tensors);
  const bool leading = world.device() == leader;
  const std::string records =
      write_device_files(staged_path(options, step), world.device(), leading, tensors);
  commit_checkpoint(world, leader, options, step, optimizer, layouts_of(tensors), data, records,
                    /*drop_old=*/true);
}

CheckpointWriter::CheckpointWriter(DeviceId leader, CheckpointOptions options)
    : leader_(leader), options_(std::move(options)) {}

CheckpointWriter::~CheckpointWriter() {
  // A write still in flight is abandoned: its staged folder is never committed (the next save
  // clears it).
  if (writer_.joinable()) writer_.join();
}

double CheckpointWriter::start(Communicator& world, int step, const nlohmann::json& optimizer,
                               const std::vector<SavedTensor>& tensors,
                               const nlohmann::json& data) {
  const double begin = steady_seconds();
  poll(world, /*wait=*/true);  // at most one write in flight
  stage_checkpoint(world, leader_, options_, step, tensors);
  // The snapshot: this device's shards copied to buffers kept from the last checkpoint.
  const DeviceId me = world.device();
  snapshot_.resize(tensors.size());
  pending_ = Pending{.step = step, .optimizer = optimizer, .data = data};
  std::vector<SavedTensor> copies;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const SavedTensor& t = tensors[i];
    pending_->tensors.emplace_back(t.name, t.layout);
    if (!t.shard || !is_representative(t.layout, me)) {
      copies.push_back({t.name, t.layout, nullptr});
      continue;
    }
    Tensor& copy = snapshot_[i];
    if (copy.shape() != t.shard->shape() || copy.dtype() != t.shard->dtype())
      copy = Tensor::uninitialized(t.shard->dtype(), t.shard->shape());
    // On the device's threads (its team, where the step's kernels run), a MiB at a time.
    const std::byte* from = t.shard->bytes();
    std::byte* to = copy.bytes();
    const auto bytes = static_cast<std::int64_t>(t.shard->nbytes());
    parallel_for(bytes, std::int64_t{1} << 20, [&](std::int64_t lo, std::int64_t hi) {
      std::memcpy(to + lo, from + lo, static_cast<std::size_t>(hi - lo));
    });
    copies.push_back({t.name, t.layout, &copy});
  }
  done_ = false;
  const bool leading = me == leader_;
  writer_ = std::thread([this, staged = staged_path(options_, step), me, leading, copies] {
    // The leader's writer first drops what the last commit left beyond keep_last.
    if (leading) {
      try {
        drop_old_checkpoints(options_);
      } catch (const std::exception& e) {
        records_ = fmt::format("!cannot drop old checkpoints: {}", e.what());
        done_ = true;
        return;
      }
    }
    records_ = write_device_files(staged, me, leading, copies);
    done_ = true;
  });
  return steady_seconds() - begin;
}

double CheckpointWriter::poll(Communicator& world, bool wait, bool last) {
  if (!pending_) return 0;
  const double begin = steady_seconds();
  if (wait) writer_.join();
  // Every device's files durable: the devices agree before the commit's gather.
  std::int32_t ready = done_ ? 1 : 0;
  all_reduce(world, {.send = reinterpret_cast<const std::byte*>(&ready),
                     .recv = reinterpret_cast<std::byte*>(&ready),
                     .count = 1,
                     .dtype = DType::kInt32,
                     .op = ReduceOp::kMin});
  if (ready == 0) return steady_seconds() - begin;
  if (writer_.joinable()) writer_.join();
  const Pending p = std::move(*pending_);
  pending_.reset();
  commit_checkpoint(world, leader_, options_, p.step, p.optimizer, p.tensors, p.data, records_,
                    /*drop_old=*/last);
  return steady_seconds() - begin;
}

bool CheckpointWriter::pending() const { return pending_.has_value(); }

std::int64_t CheckpointWriter::snapshot_bytes() const {
  std::int64_t bytes = 0;
  for (const Tensor& t : snapshot_) bytes += static_cast<std::int64_t>(t.nbytes());
  return bytes;
}

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
