// Shape: the extent of each dim of a tensor, outermost first, and its text form "16x16".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshflow {

// Extents of a tensor's dims, outermost first. A 0-d shape (scalar) has one element.
using Shape = std::vector<std::int64_t>;

// Returns the number of elements of `shape` (1 for a 0-d shape).
std::int64_t numel(const Shape& shape);

// Returns the text form "4x8" ("()" for a 0-d shape).
std::string to_string(const Shape& shape);

// Returns the shape written as "4x8" or "4,8" (empty text or "()" is 0-d); throws Error naming
// `text` when it is malformed or has a negative extent.
Shape parse_shape(std::string_view text);

// Returns row-major strides (in elements) of `shape`.
std::vector<std::int64_t> row_major_strides(const Shape& shape);
// Writes them to out[0, shape.size()) instead, for callers that keep them off the heap.
void row_major_strides(const Shape& shape, std::span<std::int64_t> out);

// Returns the index of the first element of row `row` of `shape` (its rows: every dim but the
// last, row-major; the last entry 0): where an odometer over the rows starts at that row.
std::vector<std::int64_t> row_start_index(const Shape& shape, std::int64_t row);

}  // namespace meshflow
