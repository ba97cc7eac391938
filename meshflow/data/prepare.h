// `meshflow data prepare`: UTF-8 text files to a dataset. The files are concatenated byte for
// byte in the order given, the tokenizer is trained on the text (bpe) or taken as it is
// (bytes), the text is encoded, and the val split is cut off: with a separator line, the text is
// cut into documents after each line equal to it (each document keeps its separator line) and
// documents n, 2n, 3n, … (1-based, n = ⌈1/F⌉) go to val; without, the last ⌊F·N⌋ of the N
// tokens. DIR gets train.npy, val.npy (uint16 where V ≤ 65,536, else int32), tokenizer.json
// and, for bpe, tokenizer.model; it appears whole or not at all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshflow/data/tokenizer.h"

namespace meshflow {

struct PrepareOptions {
  std::vector<std::filesystem::path> text;
  std::filesystem::path out;
  TokenizerKind tokenizer = TokenizerKind::kBytes;
  std::int64_t vocab_size = 4096;  // bpe
  double val_fraction = 0.1;       // F, in (0, 1)
  std::optional<std::string> separator;
  // Called with a line of progress (reading, training, encoding) on large inputs.
  std::function<void(std::string_view)> progress;
};

struct PrepareReport {
  std::int64_t train_tokens = 0, val_tokens = 0, text_bytes = 0;
  // Returns the text's bytes per token.
  double bytes_per_token() const;
};

// Returns what was written; throws Error naming the file or option at fault.
PrepareReport prepare_data(const PrepareOptions& options);

// Returns the documents of `text`: cut after each line equal to `separator` (the line and its
// newline stay with the document before the cut); a last document without a separator line
// counts when it is not empty.
std::vector<std::string_view> split_documents(std::string_view text, std::string_view separator);

}  // namespace meshflow
