// Checked size arithmetic.
#include "meshflow/core/limits.h"

#include "meshflow/core/error.h"

namespace meshflow {

std::int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what) {
  if (shape.size() > static_cast<std::size_t>(kMaxTensorRank)) {
    fail(ErrorKind::kInvalidArgument, "{} {} has {} dims; at most {} are supported", what,
         to_string(shape), shape.size(), kMaxTensorRank);
  }
  const auto es = static_cast<std::int64_t>(size_of(dtype));
  std::int64_t n = 1;
  // The product of the non-zero extents is bounded even when another extent is 0, so every
  // product of extents (strides, chunk sizes, box corners) stays in range.
  bool empty = false;
  for (std::int64_t e : shape) {
    if (e < 0) {
      fail(ErrorKind::kInvalidArgument, "{} {} has a negative extent {}", what, to_string(shape),
           e);
    }
    empty = empty || e == 0;
  }
  for (std::int64_t e : shape) {
    if (e == 0) continue;
    if (e > kMaxTensorBytes / es / n) {
      fail(ErrorKind::kInvalidArgument,
           "{} {} of {} is too large: a tensor may hold at most {} bytes (64 TiB)", what,
           to_string(shape), to_string(dtype), kMaxTensorBytes);
    }
    n *= e;
  }
  return empty ? 0 : n;
}

std::int64_t checked_mesh_size(const Shape& shape, std::string_view what) {
  if (shape.empty() || shape.size() > static_cast<std::size_t>(kMaxMeshRank)) {
    fail(ErrorKind::kInvalidArgument, "{} {} has {} dims; a mesh has 1 to {}", what,
         to_string(shape), shape.size(), kMaxMeshRank);
  }
  std::int64_t n = 1;
  for (std::int64_t e : shape) {
    if (e < 1) {
      fail(ErrorKind::kInvalidArgument, "{} {} has an extent below 1: {}", what, to_string(shape),
           e);
    }
  }
  for (std::int64_t e : shape) {
    if (e > kMaxMeshDevices / n) {
      fail(ErrorKind::kInvalidArgument, "{} {} is too large: a mesh may hold at most {} devices",
           what, to_string(shape), kMaxMeshDevices);
    }
    n *= e;
  }
  return n;
}

int checked_int(std::int64_t value, std::int64_t lo, std::int64_t hi, std::string_view what) {
  if (value < lo || value > hi) {
    fail(ErrorKind::kInvalidArgument, "{} must lie in [{}, {}], got {}", what, lo, hi, value);
  }
  return static_cast<int>(value);
}

}  // namespace meshflow
