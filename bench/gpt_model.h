// The GPT of examples/models/gpt at the bench's size. make_gpt.py is its one definition: the
// script is built into this binary, and GptFiles runs it (/usr/bin/python3 with NumPy, as the
// examples need) to write the model files and token data of one size into a folder of its own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "bench/report.h"
#include "meshflow/graph/model_file.h"

namespace meshflow::bench {

struct GptConfig {
  std::int64_t batch = 8, seq = 256, width = 512, heads = 8, vocab = 8192;
  int blocks = 2;
};

// Throws Error naming the value when the width is not a multiple of the heads or there is no
// block.
void check_gpt_config(const GptConfig& config);

// make_gpt.py's files for `config` with 1-d meshes of `devices` devices, in a temporary folder
// removed with this object.
class GptFiles {
 public:
  // Writes the files; throws Error with the script's message when it fails. With `data` (a
  // folder of train.npy and val.npy), the models read it (make_gpt.py's --data); `init` is its
  // --init ("default" or "gpt2").
  GptFiles(const GptConfig& config, int devices, const std::filesystem::path& data = {},
           const std::string& init = "default");

  // Returns layout `layout`'s model ("one", "dp", "tp", "tp_vocab", "sp", "dp_tp"); its token
  // inputs are read from this folder when it runs.
  Model load(std::string_view layout) const;
  // Returns layout `layout`'s model file.
  std::filesystem::path path(std::string_view layout) const;

 private:
  TempFolder folder_{"meshflow_gpt"};
};

// The same GPT in PyTorch eager (torch.nn layers without biases in the products, attention as
// eager PyTorch computes it): Python that defines `step()`, one step of `optimizer` (a
// torch.optim expression over `params`), for the bench's PyTorch baseline.
std::string pytorch_gpt(const GptConfig& config, const std::string& optimizer);

}  // namespace meshflow::bench
