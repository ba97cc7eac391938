// The sizes meshflow accepts, and the one place where size arithmetic is checked. Every count a
// user can influence (tensor extents, element and byte counts, mesh sizes, device ids, box
// corners) passes through these functions before anything is sized or allocated by it, so a
// size that does not fit is an Error naming the value, never an overflow or a runaway allocation.
//
// The bounds are chosen so that every derived quantity fits in int64 with room to spare: the
// bytes any plan moves are at most kMaxMeshDevices * kMaxTensorBytes = 2^62.
#pragma once

#include <cstdint>
#include <string_view>

#include "meshflow/core/dtype.h"
#include "meshflow/core/shape.h"

namespace meshflow {

// The most bytes one tensor (global or local) may hold: 64 TiB.
inline constexpr std::int64_t kMaxTensorBytes = std::int64_t{1} << 46;
// The most dims a tensor may have (NumPy's own limit).
inline constexpr int kMaxTensorRank = 64;
// The most devices one mesh may hold.
inline constexpr std::int64_t kMaxMeshDevices = std::int64_t{1} << 16;
// The most dims a mesh may have.
inline constexpr int kMaxMeshRank = 16;

// Returns the number of elements of `shape` after checking that its rank is at most
// kMaxTensorRank, every extent is non-negative, and the product of its non-zero extents times
// size_of(dtype) is at most kMaxTensorBytes (so no product of its extents can overflow); throws
// Error(kInvalidArgument) naming `what` ("shape") and the shape otherwise.
std::int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what);

// Returns the number of devices a mesh of `shape` holds after checking that it has 1 to
// kMaxMeshRank dims, every extent is at least 1 and the product is at most kMaxMeshDevices;
// throws Error(kInvalidArgument) naming `what` and the shape otherwise.
std::int64_t checked_mesh_size(const Shape& shape, std::string_view what);

// Returns `value` as an int (a device id, a rank, a count an API takes as int); throws
// Error(kInvalidArgument) naming `what` when it lies outside [lo, hi].
int checked_int(std::int64_t value, std::int64_t lo, std::int64_t hi, std::string_view what);

}  // namespace meshflow
