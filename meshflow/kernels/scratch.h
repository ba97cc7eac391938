// Scratch arrays for the kernels' partial results (a block of rows' partial sums): a std::vector
// whose storage is aligned as a Tensor's is (kTensorAlignment, one cache line). malloc returns
// 16-byte alignment, and a 64 KiB block 16 bytes past a page boundary, so a row of partial sums
// read and written a 64-byte register at a time split two lines on every access. Layer norm's scale
// and bias gradients over the bench GPT's [2048, 512] on two threads, each row adding into its
// block's partial rows: 105-113 us with malloc's partial rows 16 bytes off a line, 80-82 us with
// these (interleaved rep by rep in one process). Whole `bench kernels` runs alternated with the
// binary before: layer_norm_bwd 112-114 us against 122-124 with the floor from cache; no difference
// beyond the spread in runs where it was not (malloc places the rows differently from run to run;
// this makes the fast case certain).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "meshflow/core/tensor.h"

namespace meshflow {

// Storage aligned as a Tensor's, for std::vector.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kTensorAlignment}));
  }
  void deallocate(T* p, std::size_t n) {
    ::operator delete (p, n * sizeof(T), std::align_val_t{kTensorAlignment});
  }
  bool operator==(const CacheLineAllocator&) const = default;
};

template <class T>
using ScratchVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace meshflow
