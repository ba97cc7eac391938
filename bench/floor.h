// DESIGN's floor of a memory-bound kernel (`meshflow bench kernels`): the bytes the kernel reads
// and writes moved by plain memcpy between buffers of the same sizes, each destination byte
// written once from where it lives, plus one read of every term a reduction adds.
#pragma once

#include <cstdint>
#include <vector>

#include "meshflow/core/tensor.h"

namespace meshflow::bench {

// Bytes of an operand a memory-bound kernel reads: its first `bytes` (all of it where -1), a
// multiple of 4 (read as floats where a reduction reads them).
struct FloorRead {
  const Tensor* from = nullptr;
  std::int64_t bytes = -1;
};

// A destination the size of the kernel's results, filled by memcpy from the operands it reads,
// in order; the operands' bytes left over once it is full are read (summed, as a reduction reads
// its terms); the destination's bytes left over once the operands are spent are zeroed (a
// scatter's rows no index names). Each thread of the caller's team (kernels/parallel.h) takes
// its share of every piece, in one parallel loop. Owns the destination; reads the operands,
// which must outlive it.
class MemoryFloor {
 public:
  MemoryFloor(const std::vector<FloorRead>& reads, std::int64_t writes);

  std::int64_t bytes() const { return bytes_; }  // read and written
  const Tensor& destination() const { return to_; }

  void run();

 private:
  struct Piece {
    const std::byte* from;  // null: zeroed
    std::byte* to;          // null: read alone
    std::int64_t bytes;
  };
  Tensor to_;
  std::vector<Piece> pieces_;
  std::int64_t bytes_ = 0;
  volatile float sink_ = 0;  // the reads' sums, kept so that they are made
};

}  // namespace meshflow::bench
