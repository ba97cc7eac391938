// A generated sample's text as its tokens arrive (DESIGN "Generation", output): decoded by the
// tokenizer, or without one the ids written as "3 17 4". What is handed out to print is always
// whole UTF-8: a character whose bytes span several tokens is held back until it is whole, and
// a byte that can never start or finish a character is printed as U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshflow/data/tokenizer.h"
#include "meshflow/infer/generate.h"

namespace meshflow {

struct TextStream {
  const Tokenizer* tokenizer = nullptr;  // null: the ids as text
  std::vector<std::int64_t> ids;         // every id pushed
  std::string decoded;                   // the text of `ids` (bytes, possibly not yet valid)
  std::size_t emitted = 0;               // the bytes of `decoded` handed out
};

// Appends `id`; returns the text that became printable.
std::string push_token(TextStream& s, std::int64_t id);

// Returns the text still held back (an unfinished character, as U+FFFD).
std::string finish_text(TextStream& s);

// Returns the whole text so far, valid UTF-8 (an unfinished character as U+FFFD).
std::string whole_text(const TextStream& s);

// Returns whether the text so far ends with one of `stops`.
bool ends_with_any(const TextStream& s, const std::vector<std::string>& stops);

// Returns the longest prefix of `bytes` that holds only whole characters when `final` is false
// (the rest may yet become one), written as valid UTF-8 (an invalid byte as U+FFFD), and sets
// `used` to the bytes it covers.
std::string valid_utf8(std::string_view bytes, bool final, std::size_t& used);

// Returns `meshflow generate --json`'s object: {"samples": [{"tokens", "text" (the continuation,
// or null without a tokenizer), "logprobs"}], "prompt_tokens", "prefill_s", "decode_s",
// "tokens_per_s" (the tokens after each sample's first over decode_s; null when none)}.
// `texts` holds each sample's stream.
nlohmann::json generation_json(const GenerateReport& report,
                               const std::vector<std::int64_t>& prompt,
                               const std::vector<TextStream>& texts);

}  // namespace meshflow
