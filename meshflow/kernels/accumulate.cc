// The accumulation loops, vectorised by the compiler (this folder is built at -O3) and split
// over the device's threads.
#include "meshflow/kernels/accumulate.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/scratch.h"
#include "meshflow/kernels/vectorize.h"

namespace meshflow {

void add_into(Tensor& sum, const Tensor& x) {
  MESHFLOW_CHECK(sum.shape() == x.shape() && sum.dtype() == x.dtype(), "add_into: {} into {}",
                 to_string(x.shape()), to_string(sum.shape()));
  visit_dtype(sum.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* __restrict s = sum.data<T>().data();
      const T* __restrict v = x.data<T>().data();
      parallel_for(sum.numel(), kElementGrain, [=](std::int64_t begin, std::int64_t end) {
        if constexpr (std::is_same_v<T, float>) {
          add_to(s + begin, v + begin, end - begin);
        } else {
          T* __restrict sl = s;  // locals: the loop reads no pointer through the closure
          const T* __restrict vl = v;
          for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
            sl[i] += vl[i];
        }
      });
    } else {
      MESHFLOW_CHECK(false, "add_into on {}", to_string(sum.dtype()));
    }
  });
}

void scale_in_place(Tensor& t, double s) {
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T f = static_cast<T>(s);
      T* __restrict p = t.data<T>().data();
      parallel_for(t.numel(), kElementGrain, [=](std::int64_t begin, std::int64_t end) {
        T* __restrict pl = p;
        for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
          pl[i] *= f;
      });
    } else {
      MESHFLOW_CHECK(false, "scale_in_place on {}", to_string(t.dtype()));
    }
  });
}

namespace {

// out[0, n) = Σ over the rows of x's columns [0, n) (rows `stride` apart), each column from 0 in
// row order. With at most kFewRows rows, kLanes columns at a time in registers (every row's
// stretch added, then written out once): through the cache each row's add also loaded and
// stored the sums, and [8, 131072] summed to [131072] (the position embedding's gradient) took
// 47-69 us alone against 44-48 us. Otherwise (and for the last columns) a block of columns at a
// time, the block's sums staying in the first-level cache while every row's stretch of it is
// added: reading many rows a register's width at a time, [2048, 512]'s blocks of 64 rows took
// 64 us against 43-49 us.
template <typename T>
[[gnu::always_inline]] inline void sum_columns(const T* x, std::int64_t rows, std::int64_t stride,
                                               std::int64_t n, T* out) {
  constexpr std::int64_t kLanes = 64 / sizeof(T) * 4, kFewRows = 16;  // four 64-byte registers
  std::int64_t done = 0;
  for (; rows <= kFewRows && done + kLanes <= n; done += kLanes) {
    T acc[kLanes] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* __restrict xr = x + r * stride + done;
      for (std::int64_t j = 0; j < kLanes; ++j) acc[j] += xr[j];
    }
    for (std::int64_t j = 0; j < kLanes; ++j) out[done + j] = acc[j];
  }
  x += done;
  out += done;
  n -= done;
  constexpr std::int64_t kBlock = 2048;
  for (std::int64_t b = 0; b < n; b += kBlock) {
    T* __restrict o = out + b;
    const std::int64_t w = std::min(kBlock, n - b);
    for (std::int64_t j = 0; j < w; ++j) o[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* __restrict xr = x + r * stride + b;
      for (std::int64_t j = 0; j < w; ++j) o[j] += xr[j];
    }
  }
}

// The float loops built per vector unit (kernels/vectorize.h).
MESHFLOW_VECTOR_CLONES
void sum_columns_f32(const float* x, std::int64_t rows, std::int64_t stride, std::int64_t n,
                     float* out) {
  sum_columns(x, rows, stride, n, out);
}

}  // namespace

MESHFLOW_VECTOR_CLONES
void add_to(float* __restrict sum, const float* __restrict x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) sum[i] += x[i];
}

namespace {

// The row blocks sum_rows adds separately: about kBlockElements values each, at most
// kMaxBlocks, at most one per row; one (the columns split over the threads instead) for rows of
// kWideRow values or more, each thread's piece of a row then long enough to stream. A function of
// the shape alone, so that every team size adds the same numbers in the same order.
constexpr std::int64_t kBlockElements = 32 * 1024, kMaxBlocks = 32, kWideRow = 8 * 1024;

// sum_columns, through the vector clones for float.
template <typename T>
void sum_block(const T* x, std::int64_t rows, std::int64_t stride, std::int64_t n, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    sum_columns_f32(x, rows, stride, n, out);
  } else {
    sum_columns(x, rows, stride, n, out);
  }
}

}  // namespace

std::int64_t sum_rows_blocks(std::int64_t rows, std::int64_t cols) {
  if (rows == 0 || cols >= kWideRow) return 1;
  return std::clamp<std::int64_t>(rows * cols / kBlockElements, 1, std::min(rows, kMaxBlocks));
}

// One block: the columns split over the team's threads, each summed in row order. Several: each
// block of rows summed in row order into its own partial row, the blocks split over the threads
// (each reading whole rows one after another), then the partial rows added in block order.
// Splitting the 512 columns of [2048, 512] took 1.8x as long on two threads (each reading 1 KiB
// of every 2 KiB row); blocks of single rows took 5x as long for [8, 131072] (one thread adding
// the eight partial rows).
template <typename T>
void sum_rows(const T* x, std::int64_t rows, std::int64_t cols, T* out) {
  const std::int64_t blocks = sum_rows_blocks(rows, cols);
  if (blocks == 1) {
    parallel_for(cols, column_grain(rows), [&](std::int64_t begin, std::int64_t end) {
      sum_block(x + begin, rows, cols, end - begin, out + begin);
    });
    return;
  }
  ScratchVector<T> partial(static_cast<std::size_t>(blocks * cols));
  parallel_for(blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const std::int64_t first = part_begin(rows, static_cast<int>(blocks), static_cast<int>(b), 1);
      const std::int64_t last =
          part_begin(rows, static_cast<int>(blocks), static_cast<int>(b) + 1, 1);
      sum_block(x + first * cols, last - first, cols, cols, partial.data() + b * cols);
    }
  });
  std::copy(partial.begin(), partial.begin() + cols, out);
  for (std::int64_t b = 1; b < blocks; ++b) {
    const T* __restrict p = partial.data() + b * cols;
    if constexpr (std::is_same_v<T, float>) {
      add_to(out, p, cols);
    } else {
      for (std::int64_t j = 0; j < cols; ++j) out[j] += p[j];
    }
  }
}

template void sum_rows<float>(const float*, std::int64_t, std::int64_t, float*);
template void sum_rows<double>(const double*, std::int64_t, std::int64_t, double*);
template void sum_rows<std::uint32_t>(const std::uint32_t*, std::int64_t, std::int64_t,
                                      std::uint32_t*);
template void sum_rows<std::uint64_t>(const std::uint64_t*, std::int64_t, std::int64_t,
                                      std::uint64_t*);

}  // namespace meshflow
