// The save side of train/checkpoint.h: the files of a checkpoint written, hashed as they go,
// synced and committed by a rename (save_checkpoint), and the same in the background
// (CheckpointWriter).
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/sha256.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/train/checkpoint.h"

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

fs::path staged_path(const CheckpointOptions& options, int step) {
  return options.dir / fmt::format(".step-{}.partial", step);
}

// The leader clears what killed writers left in options.dir (checkpoints half-written or
// half-deleted) before checkpoint `step`'s files are written; a failure reaches every device.
// Each device's writer makes the folders it writes into (write_device_files).
void stage_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                      int step) {
  std::string error;
  if (world.device() == leader) {
    try {
      fs::create_directories(options.dir);
      for (const auto& entry : fs::directory_iterator(options.dir))
        if (entry.path().filename().string().starts_with(".step-")) fs::remove_all(entry.path());
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
    // Every writer makes the folders it writes into (another's mkdir of the same folder is
    // nothing).
    if (leading) {
      for (const SavedTensor& t : tensors) {
        fs::create_directories(staged / t.name);
        write_durable(staged / t.name / "layout.json", layout_to_json(t.layout).dump(2) + "\n");
      }
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
      if (!leading) fs::create_directories(path.parent_path());
      written.push_back(unbuffered ? File::create_direct(path) : File::create(path));
      records += fmt::format("{}\t{}\t{}\n", t.name, file, write_hashed(written.back(), *t.shard));
    }
    for (const File& f : written) f.sync();
  } catch (const std::exception& e) {
    records = fmt::format("!{}", e.what());
  }
  return records;
}

// The leader's part of a commit, given every device's records: checkpoint.json written durably,
// the staged folder renamed to step-<k> (and with `drop_old` the oldest beyond keep_last
// dropped). Returns an error line, or "" when committed. No communication.
std::string write_commit(const CheckpointOptions& options, int step,
                         const nlohmann::json& optimizer,
                         const std::vector<std::pair<std::string, Layout>>& tensors,
                         const nlohmann::json& data, const std::vector<std::string>& all,
                         bool drop_old) {
  const fs::path staged = staged_path(options, step);
  const fs::path target = options.dir / fmt::format("step-{}", step);
  try {
    nlohmann::json out_tensors = nlohmann::json::object();
    for (const auto& [name, layout] : tensors)
      out_tensors[name] = {{"layout", layout_to_json(layout)}, {"files", nlohmann::json::object()}};
    for (const std::string& r : all) {
      std::size_t at = 0;
      while (at < r.size()) {
        const std::size_t end = r.find('\n', at);
        const std::string line = r.substr(at, end - at);
        at = end + 1;
        const std::size_t a = line.find('\t'), b = line.find('\t', a + 1);
        out_tensors[line.substr(0, a)]["files"][line.substr(a + 1, b - a - 1)] = line.substr(b + 1);
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
    return fmt::format("cannot commit checkpoint {}: {}", target.string(), e.what());
  }
  return "";
}

// Every device's records gathered (its files are durable once it reports them); throws
// Error(kIo) on every device alike when one could not write.
std::vector<std::string> gather_records(Communicator& world, int step, const std::string& records) {
  std::vector<std::string> all = all_gather_strings(world, records);
  for (const std::string& r : all)
    if (r.starts_with("!")) fail(ErrorKind::kIo, "checkpoint {}: {}", step, r.substr(1));
  return all;
}

// The records gathered, then the leader's write_commit; its error reaches every device.
void commit_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                       int step, const nlohmann::json& optimizer,
                       const std::vector<std::pair<std::string, Layout>>& tensors,
                       const nlohmann::json& data, const std::string& records, bool drop_old) {
  const std::vector<std::string> all = gather_records(world, step, records);
  std::string error;
  if (world.device() == leader)
    error = write_commit(options, step, optimizer, tensors, data, all, drop_old);
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
  stage_checkpoint(world, leader, options, step);
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
  // clears it). A commit under way (every device's files were durable) completes.
  if (writer_.joinable()) writer_.join();
  if (committer_.joinable()) committer_.join();
}

double CheckpointWriter::start(Communicator& world, int step, const nlohmann::json& optimizer,
                               const std::vector<SavedTensor>& tensors,
                               const nlohmann::json& data) {
  const double begin = steady_seconds();
  poll(world, /*wait=*/true);  // at most one write in flight
  // The first checkpoint clears what killed writers left, with every device waiting; later ones
  // leave the folders to the writers (the commit under way alone).
  if (!staged_before_) stage_checkpoint(world, leader_, options_, step);
  staged_before_ = true;
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
  if (wait && writer_.joinable()) writer_.join();
  // Every device's files durable: the devices agree before the commit's gather.
  std::int32_t ready = done_ ? 1 : 0;
  all_reduce(world, {.send = reinterpret_cast<const std::byte*>(&ready),
                     .recv = reinterpret_cast<std::byte*>(&ready),
                     .count = 1,
                     .dtype = DType::kInt32,
                     .op = ReduceOp::kMin});
  if (ready == 0) return steady_seconds() - begin;
  if (writer_.joinable()) writer_.join();
  Pending p = std::move(*pending_);
  pending_.reset();
  if (last) {
    settle(world);
    commit_checkpoint(world, leader_, options_, p.step, p.optimizer, p.tensors, p.data, records_,
                      /*drop_old=*/true);
    return steady_seconds() - begin;
  }
  // The handshake here; the leader's files and rename on a thread of its own, settled at the
  // next handshake (or before the last commit).
  settle(world);
  std::vector<std::string> all = gather_records(world, p.step, records_);
  if (world.device() == leader_) {
    committer_ = std::thread([this, p = std::move(p), all = std::move(all)] {
      commit_error_ = write_commit(options_, p.step, p.optimizer, p.tensors, p.data, all, false);
    });
  }
  committing_ = true;
  return steady_seconds() - begin;
}

void CheckpointWriter::settle(Communicator& world) {
  if (!committing_) return;
  committing_ = false;
  if (committer_.joinable()) committer_.join();
  const std::string error = broadcast_string(world, commit_error_, rank_of(world, leader_));
  commit_error_.clear();
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
}

bool CheckpointWriter::pending() const { return pending_.has_value(); }

std::int64_t CheckpointWriter::snapshot_bytes() const {
  std::int64_t bytes = 0;
  for (const Tensor& t : snapshot_) bytes += static_cast<std::int64_t>(t.nbytes());
  return bytes;
}

}  // namespace meshflow
