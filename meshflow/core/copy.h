// Bulk copies: a byte copy with cached or streaming stores, and a region copy (copy_box's work)
// prepared once and run a range of its leading-dim rows at a time, so that a caller can move
// several regions of one source row by row.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshflow/core/box.h"
#include "meshflow/core/limits.h"

namespace meshflow {

// How a copy writes its destination.
enum class Store {
  // Ordinary stores: each destination cache line is read into the cache, then written, and
  // stays there (what memcpy does for copies smaller than the cache).
  kCached,
  // Non-temporal stores of whole cache lines: the destination is written past the cache without
  // being read first. Pays where the data moved does not fit in the cache anyway; the writer
  // must call store_fence() before another thread may read what it wrote.
  kStreaming,
};

// Copies n bytes from src to dst (which do not overlap).
void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n, Store store);

// Makes this thread's streaming stores visible before any later store of it (a no-op where
// streaming stores are ordinary ones).
void store_fence();

// The size in bytes of the largest data cache of this machine, as Linux describes the first
// CPU's caches (sysfs), else as sysconf reports it; 0 when neither knows.
std::int64_t last_level_cache_bytes();

// The store for copies that together move `bytes` bytes: streaming when the bytes read and
// written (2 * bytes) fill the last-level cache, so that nothing copied would stay cached anyway.
Store store_for_copy_of(std::int64_t bytes);

// A region copy with its arguments checked and its strides computed: run_box_copy moves any range
// of the region's rows along dim 0. Dims [split, rank) form one contiguous run of run_bytes in both
// buffers. Pointers and strides are in bytes; only the first `rank` entries of the arrays are set.
struct BoxCopy {
  const std::byte* src;  // the region's first element in the source
  std::byte* dst;        // and in the destination
  std::size_t rank;
  std::size_t split;
  std::size_t run_bytes;
  std::array<std::int64_t, kMaxTensorRank> extent;
  std::array<std::int64_t, kMaxTensorRank> src_step;
  std::array<std::int64_t, kMaxTensorRank> dst_step;
};

// Checks and prepares copying the region `extent` at `src_offset` in `src` to `dst_offset` in
// `dst`; the preconditions are copy_box's.
BoxCopy prepare_box_copy(ConstBuffer src, const std::vector<std::int64_t>& src_offset,
                         MutableBuffer dst, const std::vector<std::int64_t>& dst_offset,
                         const std::vector<std::int64_t>& extent);

// The number of rows run_box_copy can move: extent[0], or 1 for a rank-0 region.
std::int64_t box_copy_rows(const BoxCopy& copy);

// Copies rows [first, first + count) along dim 0 of the prepared region (0 <= first, first +
// count <= box_copy_rows(copy): unchecked, the caller's loop bounds it).
void run_box_copy(const BoxCopy& copy, std::int64_t first, std::int64_t count, Store store);

}  // namespace meshflow
