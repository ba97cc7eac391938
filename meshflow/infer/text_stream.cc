#include "meshflow/infer/text_stream.h"

#include <fmt/format.h>

namespace meshflow {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the character `lead` starts (0: not a lead byte).
int sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether byte k (1-based) of a sequence led by `lead` may be `b` (RFC 3629's table).
bool continues(unsigned char lead, int k, unsigned char b) {
  if (k == 1) {
    if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
    if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  }
  return b >= 0x80 && b <= 0xBF;
}

}  // namespace

std::string valid_utf8(std::string_view bytes, bool final, std::size_t& used) {
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const int n = sequence_length(lead);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int k = 1;
    while (k < n && i + static_cast<std::size_t>(k) < bytes.size() &&
           continues(lead, k, static_cast<unsigned char>(bytes[i + static_cast<std::size_t>(k)])))
      ++k;
    if (k == n) {
      out.append(bytes.substr(i, static_cast<std::size_t>(n)));
      i += static_cast<std::size_t>(n);
    } else if (i + static_cast<std::size_t>(k) == bytes.size() && !final) {
      break;  // may yet be finished by the next token
    } else {
      out += kReplacement;  // a broken sequence: its valid part as one U+FFFD
      i += static_cast<std::size_t>(k);
    }
  }
  used = i;
  return out;
}

std::string push_token(TextStream& s, std::int64_t id) {
  s.ids.push_back(id);
  if (s.tokenizer == nullptr) {
    s.decoded += fmt::format("{}{}", s.ids.size() > 1 ? " " : "", id);
  } else if (s.tokenizer->kind() == TokenizerKind::kBytes) {
    s.decoded += static_cast<char>(static_cast<unsigned char>(id));
  } else {
    // SentencePiece joins byte pieces into characters across tokens: decode the whole.
    // A character whose byte pieces have not all come decodes as U+FFFD for now: held back.
    s.decoded = s.tokenizer->decode(s.ids);
    if (s.emitted > s.decoded.size()) s.emitted = s.decoded.size();
    std::string_view ready = std::string_view(s.decoded).substr(s.emitted);
    while (ready.ends_with(kReplacement)) ready.remove_suffix(kReplacement.size());
    std::size_t used = 0;
    std::string out = valid_utf8(ready, false, used);
    s.emitted += used;
    return out;
  }
  std::size_t used = 0;
  std::string out = valid_utf8(std::string_view(s.decoded).substr(s.emitted), false, used);
  s.emitted += used;
  return out;
}

std::string finish_text(TextStream& s) {
  std::size_t used = 0;
  std::string out = valid_utf8(std::string_view(s.decoded).substr(s.emitted), true, used);
  s.emitted += used;
  return out;
}

std::string whole_text(const TextStream& s) {
  std::size_t used = 0;
  return valid_utf8(s.decoded, true, used);
}

bool ends_with_any(const TextStream& s, const std::vector<std::string>& stops) {
  for (const std::string& stop : stops)
    if (!stop.empty() && s.decoded.ends_with(stop)) return true;
  return false;
}

nlohmann::json generation_json(const GenerateReport& report,
                               const std::vector<std::int64_t>& prompt,
                               const std::vector<TextStream>& texts) {
  nlohmann::json samples = nlohmann::json::array();
  for (std::size_t i = 0; i < report.samples.size(); ++i) {
    const bool text = i < texts.size() && texts[i].tokenizer != nullptr;
    samples.push_back({{"tokens", report.samples[i].tokens},
                       {"text", text ? nlohmann::json(whole_text(texts[i])) : nullptr},
                       {"logprobs", report.samples[i].logprobs}});
  }
  nlohmann::json rate = nullptr;
  if (report.decoded > 0 && report.decode_s > 0)
    rate = static_cast<double>(report.decoded) / report.decode_s;
  return {{"samples", samples},
          {"prompt_tokens", prompt},
          {"prefill_s", report.prefill_s},
          {"decode_s", report.decode_s},
          {"tokens_per_s", rate}};
}

}  // namespace meshflow
