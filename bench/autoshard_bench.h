// `meshflow bench autoshard`: the layout `meshflow autoshard` chooses against layouts written by
// hand, each trained and timed in the same run (threads), priced with this machine's measured
// description for that device count (or --machine's). The layouts of a model take
// turns over all its meshes, one timed step each per round.
//   <model> <mesh>  for the MLP (batch 512, 1024 -> 4096 -> 1024, bias, ReLU, softmax
//               cross-entropy) and the bench GPT (bench/gpt_model.h) on meshes 2, 4 and 2x2:
//               median_s the chosen layout's step, baseline best_hand_layout (the fastest of at
//               least 6 hand layouts: data parallel, tensor parallel, the GPT's vocabulary- and
//               sequence-parallel forms, DP×TP on a 2-d mesh, each of the 1-d ones laid on
//               every dim of a mesh of more dims, and DP at ZeRO 1 and 3 (FSDP)) on the same
//               mesh (`--meshes`, any shape); `layouts` gives each one's median (min, max),
//               estimate and est_vs_measured; rank_correlation is Spearman's between the estimates
//               and the measured medians of every layout of the model over all its meshes,
//               mesh_rank_correlation over the case's mesh's alone
//   search <model> the search alone on a large model: a 12-block GPT on 2x4 and a 1,000-layer
//               MLP chain on 64 devices (8x8), search_s and priced_s (built-in machine)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench/gpt_model.h"
#include "bench/report.h"
#include "meshflow/auto/machine_cache.h"

namespace meshflow::bench {

struct AutoshardBenchOptions {
  bool progress = true;
  int reps = 5;
  int warmup = 1;
  std::int64_t batch = 512, in = 1024, hidden = 4096;  // the MLP
  GptConfig gpt;
  std::vector<std::string> meshes{"2", "4", "2x2"};
  std::vector<std::string> models{"mlp", "gpt"};
  bool search_cases = true;
  // The machine description to price a device count's layouts with (threads per device 0: the
  // default), and which it is (each case's "machine"); empty: the built-in one.
  std::function<ChosenMachine(int devices, int threads_per_device)> machine;
};

BenchReport run_autoshard_bench(const AutoshardBenchOptions& options);

}  // namespace meshflow::bench
