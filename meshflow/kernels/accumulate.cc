// The accumulation loops, vectorised by the compiler (this folder is built at -O3).
#include "meshflow/kernels/accumulate.h"

#include "meshflow/core/error.h"

namespace meshflow {

void add_into(Tensor& sum, const Tensor& x) {
  MESHFLOW_CHECK(sum.shape() == x.shape() && sum.dtype() == x.dtype(), "add_into: {} into {}",
                 to_string(x.shape()), to_string(sum.shape()));
  visit_dtype(sum.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* __restrict s = sum.data<T>().data();
      const T* __restrict v = x.data<T>().data();
      const std::size_t n = static_cast<std::size_t>(sum.numel());
      for (std::size_t i = 0; i < n; ++i) s[i] += v[i];
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
      for (T& x : t.data<T>()) x *= f;
    } else {
      MESHFLOW_CHECK(false, "scale_in_place on {}", to_string(t.dtype()));
    }
  });
}

}  // namespace meshflow
