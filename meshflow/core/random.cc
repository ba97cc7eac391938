// Seeded random fill using splitmix64 (fast, and identical on every platform).
#include "meshflow/core/random.h"

namespace meshflow {

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void fill_random(Tensor& tensor, std::uint64_t seed) {
  std::uint64_t state = seed;
  visit_dtype(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (T& x : tensor.data<T>()) {
      std::uint64_t bits = splitmix64(state);
      if constexpr (std::is_floating_point_v<T>) {
        // 53 high bits give a uniform double in [0, 1).
        double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;
        x = static_cast<T>(2.0 * unit - 1.0);
      } else {
        x = static_cast<T>(static_cast<std::int64_t>(bits % 2001) - 1000);
      }
    }
  });
}

Tensor random_tensor(DType dtype, const Shape& shape, std::uint64_t seed) {
  Tensor t(dtype, shape);
  fill_random(t, seed);
  return t;
}

}  // namespace meshflow
