// Accumulation against the same sums in double, on random float32 and float64 tensors, alone and
// split over a team of threads.
#include "meshflow/kernels/accumulate.h"

#include <gtest/gtest.h>

#include <random>

#include "meshflow/kernels/parallel.h"

namespace meshflow {
namespace {

TEST(Accumulate, AddsAndScalesElementwiseAloneAndOnATeam) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  ThreadTeam team(3);
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (bool on_team : {false, true}) {
      const UseTeam use(on_team ? &team : nullptr);
      // Long enough to split into 3 parts on the team.
      const std::int64_t kN = on_team ? 3 * kElementGrain + 1031 : 1031;
      Tensor sum(dtype, Shape{kN}), x(dtype, Shape{kN});
      std::vector<double> want(static_cast<std::size_t>(kN));
      visit_dtype(dtype, [&](auto zero) {
        using T = decltype(zero);
        if constexpr (std::is_floating_point_v<T>) {
          for (std::int64_t i = 0; i < kN; ++i) {
            const T a = static_cast<T>(u(rng)), b = static_cast<T>(u(rng));
            sum.data<T>()[i] = a;
            x.data<T>()[i] = b;
            want[static_cast<std::size_t>(i)] =
                (static_cast<double>(a) + static_cast<double>(b)) * 0.25;
          }
        }
      });
      add_into(sum, x);
      scale_in_place(sum, 0.25);
      visit_dtype(dtype, [&](auto zero) {
        using T = decltype(zero);
        if constexpr (std::is_floating_point_v<T>) {
          for (std::int64_t i = 0; i < kN; ++i) {
            ASSERT_NEAR(static_cast<double>(sum.data<T>()[i]), want[static_cast<std::size_t>(i)],
                        1e-6)
                << i;
          }
        }
      });
    }
  }
}

}  // namespace
}  // namespace meshflow
