#include "meshflow/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "../../tests/error_of.h"
#include "meshflow/data/prepare.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

// Adversarial texts: empty lines, runs of spaces, leading spaces, multi-byte characters.
std::vector<std::string> adversarial() {
  return {"",
          "\n\n\n",
          "   leading spaces",
          "runs    of     spaces  \n  and\ttabs\t\t",
          "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82 \xe4\xb8\xad\xe6\x96\x87",
          "trailing newline\n",
          "%\nQ: why?\n%\n"};
}

std::string random_utf8(std::mt19937& rng, int chars) {
  const std::vector<std::string> pool = {
      "a", "b", " ",  "  ", "\n", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x99\x82",
      "%", "x", "\t", "Q"};
  std::string out;
  for (int i = 0; i < chars; ++i) out += pool[rng() % pool.size()];
  return out;
}

TEST(Tokenizer, BytesRoundTripAnyBytesInvalidUtf8Too) {
  const Tokenizer t = Tokenizer::bytes();
  std::mt19937 rng(58);
  for (int k = 0; k < 20; ++k) {
    std::string s(static_cast<std::size_t>(rng() % 100), '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(t.decode(t.encode(s)), s) << "seed 58, text " << k;
  }
  for (const std::string& s : adversarial()) EXPECT_EQ(t.decode(t.encode(s)), s);
  EXPECT_EQ(t.encode("\xff")[0], 255);
  EXPECT_EQ(testing::error_of([&] {
              t.decode(std::vector<std::int64_t>{3, 256});
            }),
            "id 256 is outside the vocabulary of 256");
}

TEST(Tokenizer, BpeRoundTripsAndSavesAndLoads) {
  std::mt19937 rng(59);
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i)
    lines.push_back("the cat sat on the mat " + std::to_string(i % 17) + " caf\xc3\xa9");
  const Tokenizer t = Tokenizer::train_bpe(lines, 300);
  EXPECT_EQ(t.kind(), TokenizerKind::kBpe);
  EXPECT_EQ(t.vocab_size(), 300);
  for (const std::string& s : adversarial()) EXPECT_EQ(t.decode(t.encode(s)), s);
  for (int k = 0; k < 20; ++k) {
    const std::string s = random_utf8(rng, 50);
    EXPECT_EQ(t.decode(t.encode(s)), s) << "seed 59, text " << k;
  }
  // Pieces learned: a frequent word is fewer ids than its bytes.
  EXPECT_LT(t.encode("the cat sat on the mat").size(), 22u);
  const fs::path dir = fs::temp_directory_path() / ("meshflow_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  t.save(dir);
  const Tokenizer back = Tokenizer::load(dir);
  EXPECT_EQ(back.encode("the cat \xe2\x82\xac"), t.encode("the cat \xe2\x82\xac"));
  fs::remove_all(dir);
  EXPECT_NE(testing::error_of([&] { Tokenizer::train_bpe(lines, 10); }).find("--vocab-size 10"),
            std::string::npos);
}

TEST(Prepare, DocumentsEndAfterTheirSeparatorLine) {
  EXPECT_EQ(split_documents("a\n%\nb\nc\n%\nd", "%"),
            (std::vector<std::string_view>{"a\n%\n", "b\nc\n%\n", "d"}));
  EXPECT_EQ(split_documents("a\n%\n", "%"), (std::vector<std::string_view>{"a\n%\n"}));
  EXPECT_EQ(split_documents("a\n%%\n", "%"), (std::vector<std::string_view>{"a\n%%\n"}));
}

}  // namespace
}  // namespace meshflow
