// DESIGN's floor of a memory-bound kernel (`meshflow bench kernels`): the bytes the kernel reads
// and writes moved by plain memcpy between buffers of the same sizes, each destination byte
// written once from where it lives, plus one read of every term a reduction adds.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/kernels/parallel.h"

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

// DESIGN's floor of the matrix products of a task graph (a training step, a forward pass): every
// linear's and matmul's products, their gradients', and attention's batched products, as one
// cblas_sgemm each at its shape (a batched product: one per batch element), between buffers
// allocated once per device, every device's products at once on threads of their own (as a run
// has them: the devices share the caches and the memory bus), each device's split over
// `threads` as its team splits it (kernels/gemm.h). The floor is the time until the last device
// is done.
class ProductFloor {
 public:
  // The products of the tasks of `tasks` (those run per micro-batch `micro_batches` times), on
  // `threads` threads per device.
  ProductFloor(const TaskGraph& tasks, int micro_batches, int threads);
  // Returns the seconds every device's products take, all at once.
  double time();
  // The reporting device's (device 0's).
  std::size_t products() const { return devices_.front().products.size(); }

 private:
  struct Product {
    bool trans_a = false, trans_b = false;
    std::int64_t batch = 1, m = 0, n = 0, k = 0;
  };
  struct Device {
    std::unique_ptr<ThreadTeam> team;
    std::vector<Product> products;
    Tensor a, b, c;
  };
  static void run(Device& d);
  static void add(std::vector<Product>& products, OpType type, const std::vector<Shape>& in);
  std::vector<Device> devices_;
};

}  // namespace meshflow::bench
