#include "meshflow/kernels/copy_rows.h"

#include <cstring>

#include "meshflow/kernels/vectorize.h"

namespace meshflow {

MESHFLOW_VECTOR_CLONES
void copy_rows(const std::byte* src, std::int64_t src_stride, std::byte* dst, std::int64_t rows,
               std::int64_t row_bytes) {
  const auto bytes = static_cast<std::size_t>(row_bytes);
  for (std::int64_t r = 0; r < rows; ++r, src += src_stride, dst += row_bytes) {
    std::size_t j = 0;
    // 64 bytes a move: one register where the CPU has AVX-512, inlined by the compiler.
    for (; j + 64 <= bytes; j += 64) __builtin_memcpy(dst + j, src + j, 64);
    if (j < bytes) std::memcpy(dst + j, src + j, bytes - j);
  }
}

}  // namespace meshflow
