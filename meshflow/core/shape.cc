// Shape helpers and text form.
#include "meshflow/core/shape.h"

#include <charconv>

#include "meshflow/core/error.h"

namespace meshflow {

std::int64_t numel(const Shape& shape) {
  // A zero extent first: the other extents of an empty shape need not multiply in range.
  for (std::int64_t e : shape) {
    if (e == 0) return 0;
  }
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  return n;
}

std::string to_string(const Shape& shape) {
  if (shape.empty()) return "()";
  std::string out;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(shape[i]);
  }
  return out;
}

Shape parse_shape(std::string_view text) {
  if (text.empty() || text == "()") return {};
  Shape shape;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find_first_of("x,", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    std::int64_t value = -1;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size() || value < 0) {
      fail(ErrorKind::kInvalidArgument,
           "malformed shape \"{}\" (expected non-negative extents like 16x16)", text);
    }
    shape.push_back(value);
    pos = end + 1;
  }
  return shape;
}

void row_major_strides(const Shape& shape, std::span<std::int64_t> out) {
  MESHFLOW_CHECK(out.size() >= shape.size());
  if (shape.empty()) return;
  out[shape.size() - 1] = 1;
  for (std::size_t i = shape.size(); i-- > 1;) out[i - 1] = out[i] * shape[i];
}

std::vector<std::int64_t> row_start_index(const Shape& shape, std::int64_t row) {
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t d = shape.size() - (shape.empty() ? 0 : 1); d-- > 0;) {
    index[d] = row % shape[d];
    row /= shape[d];
  }
  return index;
}

std::vector<std::int64_t> row_major_strides(const Shape& shape) {
  std::vector<std::int64_t> strides(shape.size());
  row_major_strides(shape, strides);
  return strides;
}

}  // namespace meshflow
