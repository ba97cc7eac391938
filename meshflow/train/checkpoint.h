// Sharded checkpoints (DESIGN's "Checkpoints"): every device writes its shards of every weight
// and optimizer-state tensor at once, one copy per replica group, hashing each file as it
// writes it; device 0 commits the checkpoint by a rename once every device's files are durable,
// so a checkpoint appears whole or not at all. Loading verifies every file once and reads onto
// any mesh, placements and ZeRO level. On disk:
//
//   DIR/step-<k>/checkpoint.json   {"step": k, "optimizer": {...}, "tensors": {"<name>":
//                                   {"layout": {...layout.json...}, "files": {"rank<i>.npy":
//                                   "<sha256 hex>"}}}}
//   DIR/step-<k>/<name>/           a sharded folder (layout.json, rank<i>.npy) per weight and
//                                   per optimizer-state tensor ("w1.exp_avg"), in the layout it
//                                   lives in; a device whose shard equals a lower-indexed
//                                   device's (mesh/sharding.h's representative rule) writes none
//   DIR/.step-<k>.partial/         a checkpoint being written (never loaded; cleared by the
//                                   next save)
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/tensor.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/op.h"
#include "meshflow/train/optimizer.h"

namespace meshflow {

struct CheckpointOptions {
  std::filesystem::path dir;  // --checkpoint DIR
  int every = 0;              // --checkpoint-every K: after every K-th step (0: the last only)
  int keep_last = 0;          // --keep-last N: the newest N complete checkpoints (0: all)
};

struct CheckpointTensor {
  Layout layout;
  std::map<std::string, std::string> files;  // "rank<i>.npy" -> sha256 hex
};

struct Checkpoint {
  int step = 0;
  std::filesystem::path path;  // DIR/step-<k>
  nlohmann::json optimizer;    // train/optimizer.h's to_json(Optimizer)
  // A model with data: {"rows": rows consumed, "order", "seed", "units"} (train/data_feed.h);
  // null otherwise.
  nlohmann::json data;
  std::map<std::string, CheckpointTensor> tensors;
};

// One tensor a device saves: its name, its layout, and this device's shard (null when the
// device holds none).
struct SavedTensor {
  std::string name;
  Layout layout;
  const Tensor* shard = nullptr;
};

// Saves checkpoint `step` of `tensors` into options.dir, called by every device of `world`
// (each with its own shards, the same names and layouts in the same order); the device
// `leader` stages and commits. Returns on every device once the checkpoint is committed (and
// the oldest beyond keep_last deleted). Throws Error(kIo) naming a file that cannot be written.
void save_checkpoint(Communicator& world, DeviceId leader, const CheckpointOptions& options,
                     int step, const nlohmann::json& optimizer,
                     const std::vector<SavedTensor>& tensors, const nlohmann::json& data = nullptr);

// A device's checkpoints written in the background (DESIGN "Checkpoints"): at a checkpoint step
// the device copies its shards to buffers kept from one checkpoint to the next (the snapshot)
// and goes on while a thread of its own hashes, writes and syncs them; the commit's handshake
// (every device's files durable, then the leader's rename) runs on the device's own thread at a
// later step boundary. At most one write is in flight: the next checkpoint waits for it first.
// Every device of the launch calls start and poll at the same steps. Once every device's files
// are durable, the leader's commit (checkpoint.json, the rename) runs on a thread of its own,
// settled (joined, its error reaching every device) at the next handshake or before the last
// commit. A write not agreed when the writer is destroyed
// (a failed run) is never committed; the next save clears its folder.
class CheckpointWriter {
 public:
  CheckpointWriter(DeviceId leader, CheckpointOptions options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // At checkpoint step `step`: commits the write in flight (waiting for it), stages the
  // checkpoint, copies this device's shards of `tensors` and starts writing them (save_checkpoint's
  // arguments). Returns the seconds the device was held.
  double start(Communicator& world, int step, const nlohmann::json& optimizer,
               const std::vector<SavedTensor>& tensors, const nlohmann::json& data = nullptr);
  // At a step boundary: commits the write in flight once every device's writer is done (with
  // `wait`, after waiting for this device's, so that it commits now). The leader's next writer
  // drops the checkpoints beyond keep_last; `last` (the run's last commit) drops them now.
  // Returns the seconds held. Throws Error(kIo) on every device alike when a device could not
  // write.
  double poll(Communicator& world, bool wait, bool last = false);
  bool pending() const;
  // The bytes of the snapshot's buffers (kept from one checkpoint to the next).
  std::int64_t snapshot_bytes() const;

 private:
  struct Pending {
    int step = 0;
    nlohmann::json optimizer, data;
    std::vector<std::pair<std::string, Layout>> tensors;
  };
  DeviceId leader_;
  CheckpointOptions options_;
  std::vector<Tensor> snapshot_;
  std::optional<Pending> pending_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::string records_;  // written by the writer thread before done_
  // The leader's commit of an agreed checkpoint (its files, the rename), on a thread of its own;
  // every device settles it (its error broadcast) before the next stage or the last commit.
  std::thread committer_;
  std::string commit_error_;
  bool committing_ = false;
  bool staged_before_ = false;
  void settle(Communicator& world);
};

// A tensor a resumed run loads: its name in the checkpoint and its layout in the model.
struct LoadTarget {
  std::string name;
  Layout layout;
};

// Where the devices of a shared-memory launch (threads) leave each other's shards while they
// load a checkpoint: every file is then read once, by the device that verifies it, which copies
// every device's part of it straight into that device's shard.
struct CheckpointLoadArea {
  std::mutex mu;
  std::map<DeviceId, std::vector<Tensor*>> shards;  // per device, per target
};

// Loads checkpoint `c` on every device of `world`: returns this device's shard of each of
// `targets` (an empty tensor where it holds none). Every file is verified whole exactly once,
// the files shared out among the devices. Where the devices share memory (`area` given and
// world.shares_memory()) the verifying read is the only read; otherwise each device then reads
// only its own boxes (mesh/folder_io.h's read_folder_box). Throws Error(kIo) on every device
// alike naming the first damaged or missing file, before any shard is used.
std::vector<Tensor> load_checkpoint(Communicator& world, const Checkpoint& c,
                                    const std::vector<LoadTarget>& targets,
                                    CheckpointLoadArea* area);

// Returns the complete checkpoints in `dir` (step-<k> folders holding checkpoint.json),
// ascending by step.
std::vector<std::filesystem::path> complete_checkpoints(const std::filesystem::path& dir);

// Reads `path`/checkpoint.json; throws Error(kIo) naming it when it is missing or malformed.
Checkpoint read_checkpoint(const std::filesystem::path& path);

// Returns the checkpoint --resume `given` names: `given` itself when it holds checkpoint.json,
// else the newest complete checkpoint in it; throws Error(kIo) naming `given` when there is
// none.
std::filesystem::path resume_path(const std::filesystem::path& given);

// Returns, per file of `c` whose bytes do not match its sha256 or that is missing, one line
// naming it; `only` restricts the files checked to those whose index in c's file order (tensors
// by name, files by name) satisfies it (several devices verifying one checkpoint share it out).
std::vector<std::string> damaged_files(const Checkpoint& c,
                                       const std::function<bool(int)>& only = nullptr);

// Checks that checkpoint `c` holds exactly the tensors `expected` (name -> spec), each with its
// shape and dtype, and was saved with optimizer `kind`; throws Error(kInvalidArgument), one line
// naming the tensors or the optimizer. (A damaged file is checked by damaged_files.)
void check_checkpoint_matches(const Checkpoint& c,
                              const std::map<std::string, TensorSpec>& expected,
                              OptimizerKind kind);

// Returns the defaults of a run resumed from `c`: the optimizer options saved in `c`, each
// field it lacks from `file_defaults` (the model file's "train" object); the options given
// win over them (resolve_optimizer). Throws Error(kInvalidArgument) naming `--optimizer` (or
// `optimizer=` in `style`) when `given` names another optimizer than the one saved.
OptimizerOptions resumed_defaults(const Checkpoint& c, const OptimizerOptions& given,
                                  const OptimizerOptions& file_defaults,
                                  OptionStyle style = OptionStyle::kFlag);

// Returns `meshflow checkpoint DIR --json`'s object: {"checkpoints": [{"step", "path", "bytes",
// "tensors": {"<name>": {"shape", "dtype", "layout"}}, "verified": true|false|null}]} (null:
// not verified; with `verify`, every file checked).
nlohmann::json list_checkpoints(const std::filesystem::path& dir, bool verify);

}  // namespace meshflow
