// The accumulation loops, vectorised by the compiler (this folder is built at -O3) and split
// over the device's threads.
#include "meshflow/kernels/accumulate.h"

#include <algorithm>
#include <cstdint>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"

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
        T* __restrict sl = s;  // locals: the loop reads no pointer through the closure
        const T* __restrict vl = v;
        for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
          sl[i] += vl[i];
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

template <typename T>
void sum_rows(const T* x, std::int64_t rows, std::int64_t cols, T* out) {
  parallel_for(cols, column_grain(rows), [&](std::int64_t begin, std::int64_t end) {
    T* __restrict o = out + begin;
    const std::int64_t n = end - begin;
    for (std::int64_t j = 0; j < n; ++j) o[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* __restrict xr = x + r * cols + begin;
      for (std::int64_t j = 0; j < n; ++j) o[j] += xr[j];
    }
  });
}

template void sum_rows<float>(const float*, std::int64_t, std::int64_t, float*);
template void sum_rows<double>(const double*, std::int64_t, std::int64_t, double*);
template void sum_rows<std::uint32_t>(const std::uint32_t*, std::int64_t, std::int64_t,
                                      std::uint32_t*);
template void sum_rows<std::uint64_t>(const std::uint64_t*, std::int64_t, std::int64_t,
                                      std::uint64_t*);

}  // namespace meshflow
