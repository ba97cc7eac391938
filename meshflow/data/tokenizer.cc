// The two tokenizers over libsentencepiece.
#include "meshflow/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// Feeds SentencePiece's trainer the text's lines.
class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::vector<std::string>& lines) : lines_(&lines) {}
  bool done() const override { return at_ >= lines_->size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return (*lines_)[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>* lines_;
  std::size_t at_ = 0;
};

}  // namespace

std::string_view to_string(TokenizerKind kind) {
  return kind == TokenizerKind::kBytes ? "bytes" : "bpe";
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::bytes() { return Tokenizer(); }

Tokenizer Tokenizer::train_bpe(const std::vector<std::string>& lines, std::int64_t vocab_size) {
  Tokenizer t;
  t.kind_ = TokenizerKind::kBpe;
  Lines it(lines);
  // DESIGN's options: the text round-trips (identity normalisation, spaces kept, no dummy
  // prefix, every byte representable), and ids start at the pieces (no bos or eos).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "1.0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"max_sentence_length", "1000000"},
      {"minloglevel", "2"},
      {"num_threads", "2"},
  };
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &t.model_);
  if (!status.ok()) {
    fail(ErrorKind::kInvalidArgument, "--vocab-size {}: SentencePiece cannot train it: {}",
         vocab_size, status.message());
  }
  t.processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto loaded = t.processor_->LoadFromSerializedProto(t.model_);
  MESHFLOW_CHECK(loaded.ok(), "a trained model does not load: {}", loaded.message());
  t.vocab_size_ = t.processor_->GetPieceSize();
  return t;
}

Tokenizer Tokenizer::load(const fs::path& dir) {
  const fs::path json_path = dir / "tokenizer.json";
  const nlohmann::json j = parse_json(read_file(json_path), json_path.string());
  const JsonField f(j, json_path.string());
  const std::string kind = f.member("kind").as_string();
  Tokenizer t;
  if (kind == "bytes") {
    if (f.member("vocab_size").as_int(256, 256) != 256)
      f.member("vocab_size").reject("must be 256");
    return t;
  }
  if (kind != "bpe") f.member("kind").reject("must be \"bytes\" or \"bpe\"");
  t.kind_ = TokenizerKind::kBpe;
  const fs::path model = dir / f.member("model").as_string();
  t.model_ = read_file(model);
  t.processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.processor_->LoadFromSerializedProto(t.model_);
  if (!status.ok())
    fail(ErrorKind::kIo, "{}: not a SentencePiece model: {}", model.string(), status.message());
  t.vocab_size_ = t.processor_->GetPieceSize();
  if (f.member("vocab_size").as_int(1, std::int64_t{1} << 31) != t.vocab_size_) {
    f.member("vocab_size")
        .reject(fmt::format("says {} pieces but {} holds {}", f.member("vocab_size").value().dump(),
                            model.string(), t.vocab_size_));
  }
  return t;
}

void Tokenizer::save(const fs::path& dir) const {
  nlohmann::json j = {{"kind", to_string(kind_)}, {"vocab_size", vocab_size_}, {"model", nullptr}};
  if (kind_ == TokenizerKind::kBpe) {
    j["model"] = "tokenizer.model";
    write_file_atomic(dir / "tokenizer.model", model_);
  }
  write_file_atomic(dir / "tokenizer.json", j.dump(2) + "\n");
}

std::vector<std::int64_t> Tokenizer::encode(std::string_view text) const {
  if (kind_ == TokenizerKind::kBytes) {
    std::vector<std::int64_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::vector<int> pieces;
  const auto status = processor_->Encode(text, &pieces);
  MESHFLOW_CHECK(status.ok(), "SentencePiece encode: {}", status.message());
  return {pieces.begin(), pieces.end()};
}

std::string Tokenizer::decode(std::span<const std::int64_t> ids) const {
  for (std::int64_t id : ids) {
    if (id < 0 || id >= vocab_size_)
      fail(ErrorKind::kInvalidArgument, "id {} is outside the vocabulary of {}", id, vocab_size_);
  }
  if (kind_ == TokenizerKind::kBytes) {
    std::string out(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) out[i] = static_cast<char>(ids[i]);
    return out;
  }
  std::string out;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  MESHFLOW_CHECK(status.ok(), "SentencePiece decode: {}", status.message());
  return out;
}

}  // namespace meshflow
