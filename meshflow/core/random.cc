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

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c,
                                           std::array<std::uint32_t, 2> k) {
  // The multipliers and Weyl key increments of Philox4x32 (Random123's reference values).
  constexpr std::uint64_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr std::uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = kM0 * c[0];
    const std::uint64_t p1 = kM1 * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
    k = {k[0] + kW0, k[1] + kW1};
  }
  return c;
}

}  // namespace meshflow
