// `meshflow bench train`: the PCG runtime training a model (threads).
//   train_step  one SGD step of an MLP (batch 512, 1024 -> 4096 -> 1024, ReLU, bias, softmax
//               cross-entropy, float32) on meshes 1, 2 and 4 (data parallel) and 2x2 (data x
//               tensor parallel, DESIGN.md's DP×TP layout), with overhead_s (the step's time not
//               spent in the reporting device's kernels or data movement) and, where Debian's
//               python3-torch is installed, PyTorch CPU eager on the same machine (1 thread for
//               the one-device case, 2 otherwise) as baseline `pytorch`
//   mlp_step_adamw_zero1, mlp_step_adamw_zero3  that MLP's AdamW step on 4-way data
//               parallelism under --zero 1 and --zero 3 (FSDP), against the same step at
//               --zero 0 in the same run (baseline zero_0), with each one's peak bytes
//   gpt_step    one SGD step of examples/models/gpt's GPT (2 blocks, width 512, 8 heads,
//               sequence 256, batch 8, vocabulary 8192, float32) on 1 device and data parallel
//               on 2, against PyTorch CPU eager's same model (1 and 2 threads)
//   mlp_step_data, gpt_step_data  the MLP (each mesh) and the GPT (1 and 2 devices) reading
//               each step's batch from a dataset (sample arrays of 8 batches; make_gpt.py's
//               Markov token stream, shuffled) against the same model on a fixed batch, timed
//               alternately in the same run (baseline fixed_batch), with data_wait_s and its
//               fraction of the step
//   gpt_sp_bytes  the bytes one GPT block adds to a forward pass and to a training step under
//               Megatron TP + SP on 4 devices (recording communicator), against the analytic
//               count of two all-gathers and two reduce-scatters of its activations per pass
//               (and, in a step, the all-reduce of its layer norms' parameter gradients)
//   gpt_text    the demo's GPT (scripts/demo: 2 blocks, width 128, 4 heads, context 128, batch
//               16, bytes, --init gpt2) trained data parallel on 2 devices with AdamW (lr 3e-3,
//               clipping at 1) over Debian's fortunes prepared as the demo prepares them, against
//               a nanoGPT-form PyTorch loop of the same model, initial weights, batches (meshflow's
//               shuffled order, written out), optimizer and threads; both final losses reported
//               (skipped where /usr/share/games/fortunes is missing)
//   compile     the passes and shard expansion of a 1,000-layer MLP (alternating column- and
//               row-parallel linear layers) mapped on an 8x8 mesh of 64 devices, until the task
//               graph exists; teardown_s the freeing of it, timed apart
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench/gpt_model.h"
#include "bench/report.h"
#include "meshflow/auto/machine_cache.h"

namespace meshflow::bench {

struct TrainBenchOptions {
  bool progress = true;
  int reps = 5;
  int warmup = 1;
  int text_steps = 200;  // gpt_text: the steps each side trains (every step after warmup timed)
  std::int64_t batch = 512, in = 1024, hidden = 4096;  // the MLP: in -> hidden -> in
  std::vector<std::string> meshes{"1", "2", "4", "2x2"};
  GptConfig gpt;                                  // gpt_step and gpt_sp_bytes
  std::vector<std::string> gpt_meshes{"1", "2"};  // gpt_step: data parallel
  int layers = 1000;                              // compile
  bool pytorch = true;                            // time the PyTorch baseline when torch imports
  // Each device's threads (train --threads-per-device; 0: its default); PyTorch runs with the
  // devices' threads together.
  int threads_per_device = 0;
  std::vector<std::string> cases;  // only the cases named (empty: every case)
  // The machine description est_step_s prices a case's step with, for its devices and each
  // one's threads, and which it is (the report's "machine"); empty: the built-in one.
  std::function<ChosenMachine(int devices, int threads_per_device)> machine;
};

BenchReport run_train_bench(const TrainBenchOptions& options);

}  // namespace meshflow::bench
