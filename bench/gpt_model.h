// The GPT of examples/models/gpt (make_gpt.py) built through the C++ PCG API at any size, for
// the train benchmark: a token plus a learned position embedding, pre-norm blocks of causal
// multi-head attention and a GELU MLP, a final layer norm, an LM head and the next token's
// softmax cross-entropy; weights drawn by the same seeded initialisers in the same order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "meshflow/graph/model_file.h"

namespace meshflow::bench {

struct GptConfig {
  std::int64_t batch = 8, seq = 256, width = 512, heads = 8, vocab = 8192;
  int blocks = 2;
};

enum class GptLayout {
  kDataParallel,      // the batch split over a 1-d mesh (one device: every tensor whole)
  kSequenceParallel,  // Megatron TP with vocabulary-parallel embedding and head, plus
                      // sequence parallelism, on a 1-d mesh (make_gpt.py's "sp")
};

// Throws Error naming the value when the width is not a multiple of the heads or there is no
// block.
void check_gpt_config(const GptConfig& config);

// Returns the model on `mesh_text`, reading the token ids [batch, seq] and next-token ids
// [batch * seq] (int64) from the two .npy files.
Model gpt_model(const GptConfig& config, GptLayout layout, const std::string& mesh_text,
                const std::filesystem::path& tokens, const std::filesystem::path& next);

// Writes seeded token ids for `config` to the two files gpt_model reads.
void write_gpt_tokens(const GptConfig& config, const std::filesystem::path& tokens,
                      const std::filesystem::path& next);

}  // namespace meshflow::bench
