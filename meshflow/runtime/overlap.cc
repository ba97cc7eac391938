// The decomposed all-gather + GEMM and GEMM + reduce-scatter loops.
#include "meshflow/runtime/overlap.h"

#include "meshflow/core/error.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/ops/matmul.h"

namespace meshflow {

namespace {

std::int64_t rows_of(std::int64_t rows, int n, int block) { return chunk(rows, n, block).extent; }
std::int64_t offset_of(std::int64_t rows, int n, int block) { return chunk(rows, n, block).offset; }

template <typename T>
Tensor allgather_matmul_typed(Communicator& g, const Tensor& x, std::int64_t rows, const Tensor& w,
                              GatherForm form) {
  const int n = g.size(), r = g.rank();
  const std::int64_t k = x.shape()[1], cols = w.shape()[1];
  MESHFLOW_CHECK(x.shape()[0] == rows_of(rows, n, r) && w.shape()[0] == k);
  Tensor y = Tensor::uninitialized(x.dtype(), {rows, cols});
  // The GEMM of `block`'s rows of x (at `data`) into y's rows of that block.
  auto multiply = [&](int block, const T* data) {
    const std::int64_t m = rows_of(rows, n, block);
    if (m == 0 || cols == 0) return;
    gemm<T>(false, false, m, cols, k, data, k, w.data<T>().data(), cols, T(0),
            y.data<T>().data() + offset_of(rows, n, block) * cols, cols);
  };
  // Two receive buffers, uninitialised (the largest block is block 0); tensors, so a loop that
  // repeats reuses cached memory instead of zeroing and faulting in fresh pages each call.
  const Shape most{rows_of(rows, n, 0), k};
  Tensor buf_t[2] = {Tensor::uninitialized(x.dtype(), most),
                     Tensor::uninitialized(x.dtype(), most)};
  T* buf[2] = {buf_t[0].data<T>().data(), buf_t[1].data<T>().data()};
  const T* own = x.data<T>().data();
  if (form == GatherForm::kPermute) {
    // Step k receives block (r + k) mod n while the block of step k - 1 is multiplied.
    const T* previous = own;
    for (int step = 1; step < n; ++step) {
      const int from = (r + step) % n;
      T* incoming = buf[step % 2];
      Event e = collective_permute_async(g, {.send = reinterpret_cast<const std::byte*>(own),
                                             .send_count = x.shape()[0] * k,
                                             .recv = reinterpret_cast<std::byte*>(incoming),
                                             .recv_count = rows_of(rows, n, from) * k,
                                             .dtype = x.dtype(),
                                             .shift = step});
      multiply((r + step - 1) % n, previous);
      e.wait(g.default_timeout());
      previous = incoming;
    }
    multiply((r + n - 1) % n, previous);
    return y;
  }
  // Broadcast form: block b arrives while block b - 1 is multiplied. The root's block is only
  // read by the broadcast, so its own buffer serves.
  auto start = [&](int block) {
    T* data = block == r ? const_cast<T*>(own) : buf[block % 2];
    return broadcast_async(g, {.data = reinterpret_cast<std::byte*>(data),
                               .count = rows_of(rows, n, block) * k,
                               .dtype = x.dtype(),
                               .root = Rank{block}});
  };
  auto data_of = [&](int block) -> const T* { return block == r ? own : buf[block % 2]; };
  Event e = start(0);
  for (int block = 0; block < n; ++block) {
    e.wait(g.default_timeout());
    if (block + 1 < n) e = start(block + 1);
    multiply(block, data_of(block));
  }
  e.wait(g.default_timeout());
  return y;
}

template <typename T>
Tensor matmul_reduce_scatter_typed(Communicator& g, const Tensor& x, const Tensor& w) {
  const int n = g.size(), r = g.rank();
  const std::int64_t rows = x.shape()[0], k = x.shape()[1], cols = w.shape()[1];
  MESHFLOW_CHECK(w.shape()[0] == k);
  const Shape most{rows_of(rows, n, 0), cols};
  Tensor part_t[2] = {Tensor::uninitialized(x.dtype(), most),
                      Tensor::uninitialized(x.dtype(), most)};
  Tensor received_t = Tensor::uninitialized(x.dtype(), most);
  T* part[2] = {part_t[0].data<T>().data(), part_t[1].data<T>().data()};
  T* received = received_t.data<T>().data();
  // The last step (block r) accumulates straight into the result.
  Tensor y = Tensor::uninitialized(x.dtype(), {rows_of(rows, n, r), cols});
  Event in_flight;
  for (int step = 0; step < n; ++step) {
    const int block = (r + step + 1) % n;
    const std::int64_t m = rows_of(rows, n, block);
    T* p = step == n - 1 ? y.data<T>().data() : part[step % 2];
    if (m > 0 && cols > 0) {
      if (k > 0) {
        gemm<T>(false, false, m, cols, k, x.data<T>().data() + offset_of(rows, n, block) * k, k,
                w.data<T>().data(), cols, T(0), p, cols);
      } else {
        std::fill(p, p + m * cols, T(0));
      }
    }
    if (step > 0) {
      in_flight.wait(g.default_timeout());
      for (std::int64_t i = 0; i < m * cols; ++i) p[i] += received[i];
    }
    if (step + 1 < n) {
      // Pass this block's partial sum to r - 1; receive from r + 1 its partial sum of the block
      // this rank multiplies next.
      in_flight =
          collective_permute_async(g, {.send = reinterpret_cast<const std::byte*>(p),
                                       .send_count = m * cols,
                                       .recv = reinterpret_cast<std::byte*>(received),
                                       .recv_count = rows_of(rows, n, (r + step + 2) % n) * cols,
                                       .dtype = x.dtype(),
                                       .shift = 1});
    }
  }
  return y;
}

}  // namespace

Tensor allgather_matmul(Communicator& group, const Tensor& x_local, std::int64_t rows,
                        const Tensor& w, GatherForm form) {
  MESHFLOW_CHECK(x_local.shape().size() == 2 && w.shape().size() == 2 &&
                 x_local.dtype() == w.dtype());
  if (x_local.dtype() == DType::kFloat64)
    return allgather_matmul_typed<double>(group, x_local, rows, w, form);
  MESHFLOW_CHECK(x_local.dtype() == DType::kFloat32, "allgather_matmul on {}",
                 to_string(x_local.dtype()));
  return allgather_matmul_typed<float>(group, x_local, rows, w, form);
}

Tensor matmul_reduce_scatter(Communicator& group, const Tensor& x_local, const Tensor& w_local) {
  MESHFLOW_CHECK(x_local.shape().size() == 2 && w_local.shape().size() == 2 &&
                 x_local.dtype() == w_local.dtype());
  if (x_local.dtype() == DType::kFloat64)
    return matmul_reduce_scatter_typed<double>(group, x_local, w_local);
  MESHFLOW_CHECK(x_local.dtype() == DType::kFloat32, "matmul_reduce_scatter on {}",
                 to_string(x_local.dtype()));
  return matmul_reduce_scatter_typed<float>(group, x_local, w_local);
}

}  // namespace meshflow
