// Strict reading of JSON input (layout.json, machine descriptions, later model files): every
// value is checked for its type and range before use, and every error names the file and the
// field ("layout.json: \"mesh.shape[1]\" must be an integer in [1, 65536], got 2.5"), never the
// JSON library's own text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "meshflow/core/error.h"

namespace meshflow {

// Returns the JSON value `text` encodes; throws Error(kIo) naming `source` and the byte where it
// stops being JSON.
nlohmann::json parse_json(std::string_view text, std::string_view source);

// A JSON value together with where it came from (file and field path), for messages. A view:
// the value must outlive it. Every accessor throws Error(`kind`) naming the field on a type or
// range mismatch.
class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string source, ErrorKind kind = ErrorKind::kIo)
      : value_(&value), source_(std::move(source)), kind_(kind) {}

  const nlohmann::json& value() const { return *value_; }
  // Returns "\"mesh.shape[1]\"" (or "the top level"), as messages name the field.
  std::string name() const;

  // Returns member `key` of this object; throws when this is not an object or lacks `key`.
  JsonField member(std::string_view key) const;
  // Returns member `key` if this object has it.
  std::optional<JsonField> find(std::string_view key) const;
  // Returns the number of elements of this array; throws when this is not an array.
  std::size_t size() const;
  // Returns element `index` of this array.
  JsonField at(std::size_t index) const;

  // Returns this integer (a JSON number without fraction or exponent) within [lo, hi].
  std::int64_t as_int(std::int64_t lo, std::int64_t hi) const;
  // Returns this finite number within [lo, hi].
  double as_number(double lo, double hi) const;
  std::string as_string() const;
  // Returns this boolean (true or false, nothing else).
  bool as_bool() const;
  // Throws naming the field: `problem` says what is wrong ("must be ...").
  [[noreturn]] void reject(std::string_view problem) const;

 private:
  JsonField(const nlohmann::json& value, std::string source, std::string path, ErrorKind kind)
      : value_(&value), source_(std::move(source)), path_(std::move(path)), kind_(kind) {}
  // Returns a short text form of the value for messages (long values are cut).
  std::string shown() const;

  const nlohmann::json* value_;
  std::string source_;
  std::string path_;
  ErrorKind kind_;
};

}  // namespace meshflow
