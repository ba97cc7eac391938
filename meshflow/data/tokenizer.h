// Tokenizers (DESIGN.md "Data, evaluation and tokenizers"): `bytes` (the ids are the 256 byte
// values) and `bpe` (a SentencePiece BPE model trained on the text by Debian's libsentencepiece,
// with byte fallback, identity normalisation, no removal of extra whitespace and no dummy
// prefix, so that every UTF-8 text without U+2581 decodes back to itself). On disk, a folder:
// tokenizer.json ({"kind": "bytes" | "bpe", "vocab_size": V, "model": "tokenizer.model" | null})
// and, for bpe, tokenizer.model (SentencePiece's own file: Python's sentencepiece loads it and
// encodes the same ids).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshflow {

enum class TokenizerKind { kBytes, kBpe };

// Returns "bytes" or "bpe"; parses them (nullopt otherwise).
std::string_view to_string(TokenizerKind kind);

// A tokenizer; owns a bpe model's processor.
class Tokenizer {
 public:
  // Returns the byte tokenizer.
  static Tokenizer bytes();
  // Returns a BPE model of `vocab_size` pieces trained on `lines` (the text's lines, without
  // their newlines); throws Error(kInvalidArgument) naming --vocab-size when SentencePiece
  // cannot make that many (too few for the characters and 256 byte pieces, or too many for
  // the text).
  static Tokenizer train_bpe(const std::vector<std::string>& lines, std::int64_t vocab_size);
  // Returns the tokenizer saved in `dir`; throws Error naming the file.
  static Tokenizer load(const std::filesystem::path& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  TokenizerKind kind() const { return kind_; }
  std::int64_t vocab_size() const { return vocab_size_; }

  // Writes tokenizer.json (and tokenizer.model) into `dir`, which exists.
  void save(const std::filesystem::path& dir) const;
  // Returns the ids of `text`.
  std::vector<std::int64_t> encode(std::string_view text) const;
  // Returns the text of `ids`; throws Error(kInvalidArgument) naming an id outside the
  // vocabulary.
  std::string decode(std::span<const std::int64_t> ids) const;

 private:
  Tokenizer() = default;
  TokenizerKind kind_ = TokenizerKind::kBytes;
  std::int64_t vocab_size_ = 256;
  std::string model_;  // bpe: the serialized model
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace meshflow
