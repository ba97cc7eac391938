// Generation (DESIGN "Generation"): a prompt continued on the model's own meshes and placements.
// With the cache, the prompt runs once (prefill: the decoder graph at the prompt's length) and
// each new token then runs the decoder graph at length 1, every causal attention reading and
// appending to its KV cache (infer/decoder_graph.h); without it, every new token runs the whole
// context (the reference the cache must equal). The process that reports (under mpi, rank 0)
// chooses each token (infer/sampling.h) and broadcasts it; the runtime only runs the graphs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "meshflow/graph/model_file.h"
#include "meshflow/infer/sampling.h"
#include "meshflow/runtime/model_runner.h"

namespace meshflow {

struct GenerateOptions {
  // A --save folder, a checkpoint (DIR/step-<k>), or a checkpoint folder (its newest complete
  // checkpoint), in any layouts.
  std::filesystem::path weights;
  std::vector<std::int64_t> prompt;  // token ids
  int max_new_tokens = 100;          // N
  int num_samples = 1;               // R, generated as one batch
  SamplingOptions sampling;
  bool cache = true;
  // The tokenizer's vocabulary, when the prompt came through one: larger than the model's is an
  // error.
  std::optional<std::int64_t> tokenizer_vocabulary;
  ModelRunOptions run;  // backend, timeout, plan, threads per device
  // Called on the reporting process with each run's fetched logits (rows r·L + j: sample r's
  // j-th position of the run): tests compare them with the model's forward pass.
  std::function<void(const Tensor& logits, std::int64_t first_position)> on_logits;
};

struct GeneratedSample {
  std::vector<std::int64_t> tokens;  // the new tokens
  std::vector<double> logprobs;      // the model's log-softmax of each, at T = 1
};

struct GenerateReport {
  std::vector<GeneratedSample> samples;
  double prefill_s = 0, decode_s = 0;  // to the first tokens; after them
  std::int64_t decoded = 0;            // the new tokens chosen after the first ones (all samples)
  bool reporter = false;               // true on the process that reports
};

// Called on the reporting process as sample r's next token arrives; returns true once the sample
// is done (its text ends with a stop string): it takes no more tokens.
using OnToken = std::function<bool(int sample, std::int64_t token)>;

// Returns the weights folder `given` names: a checkpoint (holding checkpoint.json), else the
// newest complete step-<k> checkpoint in it, else `given` (a --save folder).
std::filesystem::path weights_folder(const std::filesystem::path& given);

// Generates. Throws Error(kInvalidArgument), one line and before any token, for an empty prompt,
// an id outside the vocabulary, N or R < 1, a prompt plus N longer than the model's context
// (naming --max-new-tokens), sampling options out of range, no "generate" object, and weights
// missing a tensor of the model or holding one of another shape.
GenerateReport generate(const Model& model, const GenerateOptions& options,
                        const OnToken& on_token = nullptr);

}  // namespace meshflow
