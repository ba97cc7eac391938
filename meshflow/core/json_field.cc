// Strict JSON field access.
#include "meshflow/core/json_field.h"

#include <cmath>
#include <set>
#include <vector>

namespace meshflow {

nlohmann::json parse_json(std::string_view text, std::string_view source) {
  // nlohmann keeps the last of two equal keys silently; a file that names a key twice is
  // ambiguous, so it is refused.
  std::vector<std::set<std::string>> keys;
  auto unique_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second)
      fail(ErrorKind::kIo, "{}: key \"{}\" appears twice in one object", source,
           parsed.get<std::string>());
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), unique_keys);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kIo, "{}: invalid JSON at byte {}", source, e.byte);
  } catch (const nlohmann::json::exception&) {
    // The parser's other failure: a number too large for any JSON number type.
    fail(ErrorKind::kIo, "{}: invalid JSON: a number is out of range", source);
  }
}

std::string JsonField::name() const {
  return path_.empty() ? std::string("the top level") : fmt::format("\"{}\"", path_);
}

std::string JsonField::shown() const {
  constexpr std::size_t kMaxShown = 40;
  std::string text = value_->dump();
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

void JsonField::reject(std::string_view problem) const {
  throw Error(kind_, fmt::format("{}: {} {}", source_, name(), problem));
}

JsonField JsonField::member(std::string_view key) const {
  if (!value_->is_object()) reject(fmt::format("must be an object, got {}", shown()));
  auto it = value_->find(key);
  if (it == value_->end()) {
    throw Error(kind_, fmt::format("{}: missing field \"{}{}\"", source_,
                                   path_.empty() ? "" : path_ + ".", key));
  }
  return JsonField(*it, source_, path_.empty() ? std::string(key) : path_ + "." + std::string(key),
                   kind_);
}

std::optional<JsonField> JsonField::find(std::string_view key) const {
  if (!value_->is_object()) reject(fmt::format("must be an object, got {}", shown()));
  if (!value_->contains(key)) return std::nullopt;
  return member(key);
}

std::size_t JsonField::size() const {
  if (!value_->is_array()) reject(fmt::format("must be an array, got {}", shown()));
  return value_->size();
}

JsonField JsonField::at(std::size_t index) const {
  MESHFLOW_CHECK(index < size());
  return JsonField((*value_)[index], source_, fmt::format("{}[{}]", path_, index), kind_);
}

std::int64_t JsonField::as_int(std::int64_t lo, std::int64_t hi) const {
  auto bad = [&] {
    reject(fmt::format("must be an integer in [{}, {}], got {}", lo, hi, shown()));
  };
  if (value_->is_number_unsigned()) {
    const auto v = value_->get<std::uint64_t>();
    if (hi < 0 || v > static_cast<std::uint64_t>(hi) || static_cast<std::int64_t>(v) < lo) bad();
    return static_cast<std::int64_t>(v);
  }
  if (!value_->is_number_integer()) bad();
  const auto v = value_->get<std::int64_t>();
  if (v < lo || v > hi) bad();
  return v;
}

double JsonField::as_number(double lo, double hi) const {
  if (!value_->is_number())
    reject(fmt::format("must be a number in [{}, {}], got {}", lo, hi, shown()));
  const double v = value_->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    reject(fmt::format("must be a number in [{}, {}], got {}", lo, hi, shown()));
  return v;
}

bool JsonField::as_bool() const {
  if (!value_->is_boolean()) reject(fmt::format("must be true or false, got {}", shown()));
  return value_->get<bool>();
}

std::string JsonField::as_string() const {
  if (!value_->is_string()) reject(fmt::format("must be a string, got {}", shown()));
  return value_->get<std::string>();
}

}  // namespace meshflow
