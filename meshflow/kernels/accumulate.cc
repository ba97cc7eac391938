// The accumulation loops, vectorised by the compiler (this folder is built at -O3) and split
// over the device's threads.
#include "meshflow/kernels/accumulate.h"

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
      parallel_for(sum.numel(), kElementGrain, [&](std::int64_t begin, std::int64_t end) {
        for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
          s[i] += v[i];
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
      parallel_for(t.numel(), kElementGrain, [&](std::int64_t begin, std::int64_t end) {
        for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i)
          p[i] *= f;
      });
    } else {
      MESHFLOW_CHECK(false, "scale_in_place on {}", to_string(t.dtype()));
    }
  });
}

}  // namespace meshflow
