// `meshflow bench generate`: generation on the bench GPT (bench/gpt_model.h; context 512, so a
// 256-token prompt fits), greedy, on threads:
//   decode         one sample, `new_tokens` new tokens after a `prompt`-token prompt, on each
//                  mesh (1 device: the one-device layout; 2: its tp layout); median_s per
//                  decoding step (a new token of every sample); floor: memcpy, interleaved rep by
//                  rep, of the bytes one step reads on the busiest device (the weights it uses,
//                  one row of an embedding table per sample, the KV cache at its mean length);
//                  baseline `pytorch`: a KV-cached eager decoding loop of the same model shape on
//                  the same threads
//   decode_batch8  the same with 8 samples
//   no_cache       the same generation as decode with --no-cache (the whole context per token)
//   prefill        8 prompts of 256 tokens run once; floor: cblas_sgemm of its products
#pragma once

#include <string>
#include <vector>

#include "bench/gpt_model.h"
#include "bench/report.h"

namespace meshflow::bench {

struct GenerateBenchOptions {
  bool progress = true;
  int reps = 5, warmup = 1;
  GptConfig gpt{.batch = 8, .seq = 512};
  std::vector<std::string> meshes{"1", "2"};
  int prompt = 32, new_tokens = 200, prefill_tokens = 256, prefill_samples = 8;
  bool pytorch = true;
  int threads_per_device = 0;      // 0: the cores divided by the devices
  std::vector<std::string> cases;  // empty: all
};

BenchReport run_generate_bench(const GenerateBenchOptions& options);

}  // namespace meshflow::bench
