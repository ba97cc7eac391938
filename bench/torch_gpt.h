// The PyTorch front end's bench model (`bench train`'s torch_gpt case): examples/torch/gpt.py,
// the GPT written as PyTorch users write it, converted by meshflow.from_torch at the bench GPT's
// size and trained by PyTorch eager on the same batches as the baseline. gpt.py is built into
// this binary; the conversion runs /usr/bin/python3 with the meshflow Python package of this
// build (and Debian's python3-torch).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bench/gpt_model.h"
#include "bench/report.h"

namespace meshflow::bench {

struct TorchGpt {
  std::filesystem::path model;     // the converted model file (AdamW; reads a token dataset)
  std::vector<double> pytorch_s;   // PyTorch eager's AdamW steps on the same batches
  double convert_s = 0;            // from_torch of this GPT
  double convert_12_blocks_s = 0;  // from_torch of the same GPT with 12 blocks
};

struct TorchGptOptions {
  GptConfig config;
  std::string mesh = "1";  // data parallel over it
  int threads = 1;         // PyTorch's threads
  int steps = 5;           // PyTorch's timed steps, after `warmup`
  int warmup = 1;
};

// Converts and times; writes into `folder`. nullopt (and a line on standard error) where torch
// or the meshflow package does not import; throws Error with the script's last line when the
// conversion fails.
std::optional<TorchGpt> convert_torch_gpt(const TorchGptOptions& o,
                                          const std::filesystem::path& folder);

}  // namespace meshflow::bench
