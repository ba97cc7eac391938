#include "meshflow/kernels/copy_rows.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace meshflow {
namespace {

// Every row length from 0 to 200 bytes (whole 64-byte moves and every tail), at strides longer
// and shorter than the row is, against a byte loop; the bytes past each row stay as they were.
TEST(CopyRows, EveryRowLengthAndStrideAsAByteLoop) {
  std::vector<std::byte> src(8192);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  for (std::int64_t row_bytes = 0; row_bytes <= 200; ++row_bytes)
    for (std::int64_t stride : {row_bytes, row_bytes + 3, std::int64_t{512}}) {
      const std::int64_t rows = 5;
      std::vector<std::byte> got(static_cast<std::size_t>(rows * row_bytes + 16), std::byte{0xAB});
      std::vector<std::byte> want = got;
      copy_rows(src.data() + 1, stride, got.data(), rows, row_bytes);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < row_bytes; ++j)
          want[static_cast<std::size_t>(r * row_bytes + j)] =
              src[static_cast<std::size_t>(1 + r * stride + j)];
      ASSERT_EQ(got, want) << "row_bytes " << row_bytes << ", stride " << stride;
    }
}

}  // namespace
}  // namespace meshflow
