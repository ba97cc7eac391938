// Text to a dataset: read, train, encode, split, write.
#include "meshflow/data/prepare.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;

// Texts larger than this report their progress.
constexpr std::size_t kProgressBytes = std::size_t{8} << 20;

// Writes `ids` as a 1-d .npy of uint16 (`narrow`) or int32.
void write_ids(const fs::path& path, const std::vector<std::int64_t>& ids, bool narrow) {
  std::string out =
      encode_npy_header(narrow ? "<u2" : "<i4", {static_cast<std::int64_t>(ids.size())});
  const std::size_t width = narrow ? 2 : 4;
  const std::size_t at = out.size();
  out.resize(at + ids.size() * width);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (narrow) {
      const auto v = static_cast<std::uint16_t>(ids[i]);
      std::memcpy(out.data() + at + 2 * i, &v, 2);
    } else {
      const auto v = static_cast<std::int32_t>(ids[i]);
      std::memcpy(out.data() + at + 4 * i, &v, 4);
    }
  }
  write_file_atomic(path, out);
}

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> lines;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    if (end > at) lines.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

}  // namespace

double PrepareReport::bytes_per_token() const {
  const std::int64_t tokens = train_tokens + val_tokens;
  return tokens > 0 ? static_cast<double>(text_bytes) / static_cast<double>(tokens) : 0.0;
}

std::vector<std::string_view> split_documents(std::string_view text, std::string_view separator) {
  std::vector<std::string_view> docs;
  std::size_t start = 0, at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    const std::size_t next = end == std::string_view::npos ? text.size() : end + 1;
    if (end == std::string_view::npos) end = text.size();
    if (text.substr(at, end - at) == separator) {
      docs.push_back(text.substr(start, next - start));
      start = next;
    }
    at = next;
  }
  if (start < text.size()) docs.push_back(text.substr(start));
  return docs;
}

PrepareReport prepare_data(const PrepareOptions& o) {
  if (!(o.val_fraction > 0 && o.val_fraction < 1))
    fail(ErrorKind::kInvalidArgument, "--val-fraction {}: must be in (0, 1)", o.val_fraction);
  if (o.text.empty()) fail(ErrorKind::kInvalidArgument, "--text: name at least one file");
  if (o.tokenizer == TokenizerKind::kBpe && (o.vocab_size < 1 || o.vocab_size > (1 << 30)))
    fail(ErrorKind::kInvalidArgument, "--vocab-size {}: must be in [1, 2^30]", o.vocab_size);
  if (o.separator && o.separator->find('\n') != std::string::npos)
    fail(ErrorKind::kInvalidArgument, "--separator: a line holds no newline");
  auto progress = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  std::string text;
  for (const fs::path& p : o.text) text += read_file(p);
  const bool large = text.size() >= kProgressBytes;
  if (large) progress(fmt::format("read {} bytes from {} files", text.size(), o.text.size()));
  Tokenizer tokenizer = Tokenizer::bytes();
  if (o.tokenizer == TokenizerKind::kBpe) {
    if (large) progress(fmt::format("training a BPE model of {} pieces", o.vocab_size));
    tokenizer = Tokenizer::train_bpe(lines_of(text), o.vocab_size);
  }
  std::vector<std::int64_t> train, val;
  if (o.separator) {
    const std::vector<std::string_view> docs = split_documents(text, *o.separator);
    const auto n = static_cast<std::size_t>(std::ceil(1.0 / o.val_fraction));
    std::size_t done = 0, reported = 0;
    for (std::size_t k = 1; k <= docs.size(); ++k) {
      const std::vector<std::int64_t> ids = tokenizer.encode(docs[k - 1]);
      std::vector<std::int64_t>& split = k % n == 0 ? val : train;
      split.insert(split.end(), ids.begin(), ids.end());
      done += docs[k - 1].size();
      if (large && done - reported >= kProgressBytes) {
        progress(fmt::format("encoded {} of {} bytes", done, text.size()));
        reported = done;
      }
    }
  } else {
    train = tokenizer.encode(text);
    const auto cut =
        static_cast<std::size_t>(std::floor(o.val_fraction * static_cast<double>(train.size())));
    val.assign(train.end() - static_cast<std::ptrdiff_t>(cut), train.end());
    train.resize(train.size() - cut);
  }
  const fs::path target = output_target(o.out);
  const fs::path staged = stage_folder(target);
  try {
    const bool narrow = tokenizer.vocab_size() <= 65536;
    write_ids(staged / "train.npy", train, narrow);
    write_ids(staged / "val.npy", val, narrow);
    tokenizer.save(staged);
    commit_folder(staged, target);
  } catch (...) {
    discard(staged);
    throw;
  }
  return {.train_tokens = static_cast<std::int64_t>(train.size()),
          .val_tokens = static_cast<std::int64_t>(val.size()),
          .text_bytes = static_cast<std::int64_t>(text.size())};
}

}  // namespace meshflow
