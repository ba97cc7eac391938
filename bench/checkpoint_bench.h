// `meshflow bench checkpoint`: a checkpoint of at least 1 GiB of model and optimizer state (two
// weights and their AdamW states, float32) on a 2x2 mesh (S(0),S(1): every device writes its own
// quarter), on threads.
//   save  save_checkpoint of every tensor (train --checkpoint's path: positioned writes hashed
//         as written, fsyncs, the commit)
//   load  a resume onto another layout (S(1),S(0)): every file verified once, shared out among
//         the devices, then each device reads its boxes (train --resume's path)
// Each case's floor is the larger of `io_s` (the same bytes written, or read, with plain
// sequential I/O on the same threads, with the same fsyncs for save; loads read from the disk,
// the files evicted from the page cache first) and `hash_s` (sha256 of the same bytes on the
// same threads), measured in the same run; baseline `numpy`: np.save of every shard (save),
// np.load of every file from the disk (load), in one Python process. `peak_extra_bytes`: the
// process's peak resident memory during the case above what it held before (the state).
//   train_ckpt_every_step  the bench GPT (bench/gpt_model.h) on one device with AdamW and a
//         checkpoint after every step (written in the background), against the same run without
//         checkpoints (baseline no_checkpoints), run after run: the median step (with its
//         checkpoint_pause_s); the writer's CPU seconds per checkpoint (the runs' CPU time
//         apart) and the target it sets, 1.05 + that / (cores x the step); the mean pause
//         against memcpy of the snapshot's bytes
#pragma once

#include <filesystem>

#include "bench/report.h"

namespace meshflow::bench {

struct CheckpointBenchOptions {
  bool progress = true;
  std::int64_t bytes = std::int64_t{1} << 30;  // of the state
  int reps = 3;
  std::filesystem::path dir;  // where the files go (default: the system's temporary folder)
  std::filesystem::path python = "/usr/bin/python3";
  int train_steps = 8;  // train_ckpt_every_step's steps per run (< 2: not run)
};

BenchReport run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace meshflow::bench
