// Short strided copies, as a transpose makes them: rows of a few hundred bytes read at a stride
// and written one after another, built per vector unit (kernels/vectorize.h) so that each row
// moves in whole registers with no call per row.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshflow {

// Copies `rows` rows of row_bytes bytes: row r from src + r * src_stride to dst + r * row_bytes
// (no overlap). A memmove call per 256-byte row cost a transpose of [8, 8, 256, 64] 13% alone.
void copy_rows(const std::byte* src, std::int64_t src_stride, std::byte* dst, std::int64_t rows,
               std::int64_t row_bytes);

}  // namespace meshflow
