// Accumulation against the same sums in double, on random float32 and float64 tensors, alone and
// split over a team of threads.
#include "meshflow/kernels/accumulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

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

// Shapes that sum in one block, in several of uneven rows, and one row per block; a team of 3
// gives the same bits as one thread, and both are within float's rounding of the double sums
// (and, in one block, the float sums in row order bit for bit).
TEST(Accumulate, SumRowsAsDoubleWithTheSameBitsOnATeam) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  ThreadTeam team(3);
  for (auto [rows, cols] :
       {std::pair<std::int64_t, std::int64_t>{7, 33}, {3001, 100}, {5, 100003}, {2048, 512}}) {
    std::vector<float> x(static_cast<std::size_t>(rows * cols));
    for (float& v : x) v = u(rng);
    std::vector<float> alone(static_cast<std::size_t>(cols)), split(alone.size());
    sum_rows<float>(x.data(), rows, cols, alone.data());
    {
      const UseTeam use(&team);
      sum_rows<float>(x.data(), rows, cols, split.data());
    }
    for (std::int64_t j = 0; j < cols; ++j) {
      double want = 0, magnitude = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        want += x[static_cast<std::size_t>(r * cols + j)];
        magnitude += std::abs(x[static_cast<std::size_t>(r * cols + j)]);
      }
      const auto k = static_cast<std::size_t>(j);
      ASSERT_EQ(alone[k], split[k]) << rows << "x" << cols << " column " << j;
      if (rows < 16) {  // one block: each column summed from 0 in row order, in float
        float in_order = 0;
        for (std::int64_t r = 0; r < rows; ++r)
          in_order += x[static_cast<std::size_t>(r * cols + j)];
        ASSERT_EQ(alone[k], in_order) << rows << "x" << cols << " column " << j;
      }
      ASSERT_NEAR(alone[k], want, 1e-6 * magnitude) << rows << "x" << cols << " column " << j;
    }
  }
  std::vector<std::uint64_t> counts(3000 * 40);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = i % 7;
  std::vector<std::uint64_t> got(40);
  const UseTeam use(&team);
  sum_rows<std::uint64_t>(counts.data(), 3000, 40, got.data());
  for (std::size_t j = 0; j < got.size(); ++j) {
    std::uint64_t want = 0;
    for (std::size_t r = 0; r < 3000; ++r) want += counts[r * 40 + j];
    ASSERT_EQ(got[j], want) << "column " << j;
  }
}

}  // namespace
}  // namespace meshflow
