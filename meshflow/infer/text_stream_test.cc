#include "meshflow/infer/text_stream.h"

#include <gtest/gtest.h>

#include <string>

namespace meshflow {
namespace {

// Whether `s` is valid UTF-8.
bool valid(const std::string& s) {
  std::size_t used = 0;
  return valid_utf8(s, true, used) == s && used == s.size();
}

TEST(TextStream, HoldsACharacterBackUntilItsBytesAllCame) {
  const Tokenizer bytes = Tokenizer::bytes();
  TextStream s{.tokenizer = &bytes};
  const std::string text = "a\xC3\xA9 \xE2\x82\xAC\xF0\x9F\x98\x80!";  // a é € 😀 !
  std::string printed;
  for (unsigned char b : text) {
    const std::string part = push_token(s, b);
    EXPECT_TRUE(valid(part)) << "after byte " << int(b);
    printed += part;
    EXPECT_TRUE(valid(printed));
  }
  printed += finish_text(s);
  EXPECT_EQ(printed, text);
  EXPECT_EQ(whole_text(s), text);
}

TEST(TextStream, PrintsBytesThatCanNeverBeACharacterAsReplacements) {
  const Tokenizer bytes = Tokenizer::bytes();
  TextStream s{.tokenizer = &bytes};
  std::string printed;
  for (unsigned char b : std::string("x\xFFy\xE2\x82z\xC3")) printed += push_token(s, b);
  printed += finish_text(s);
  EXPECT_EQ(printed, "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xEF\xBF\xBD");
  EXPECT_TRUE(valid(printed));
}

TEST(TextStream, WritesIdsWithoutATokenizerAndEndsAtAStop) {
  TextStream s;
  std::string printed;
  for (std::int64_t id : {3, 17, 4}) printed += push_token(s, id);
  EXPECT_EQ(printed, "3 17 4");
  EXPECT_TRUE(ends_with_any(s, {"zz", "17 4"}));
  EXPECT_FALSE(ends_with_any(s, {"17"}));
}

TEST(TextStream, BpeCharactersFromBytePiecesArePrintedWhole) {
  std::vector<std::string> lines;
  for (int i = 0; i < 50; ++i) lines.push_back("the cat sat on the mat and the dog sat on the log");
  const Tokenizer bpe = Tokenizer::train_bpe(lines, 300);
  const std::string text = "the cat \xE2\x82\xAC\xF0\x9F\x98\x80 sat";  // € 😀: byte pieces
  TextStream s{.tokenizer = &bpe};
  std::string printed;
  for (std::int64_t id : bpe.encode(text)) {
    const std::string part = push_token(s, id);
    EXPECT_TRUE(valid(part));
    EXPECT_EQ(part.find("\xEF\xBF\xBD"), std::string::npos);
    printed += part;
  }
  printed += finish_text(s);
  EXPECT_EQ(printed, text);
}

}  // namespace
}  // namespace meshflow
