// Helpers shared by ops/'s kernel tests (kernels_test.cc, embedding_test.cc):
// seeded operands, running one operator, comparing against a reference (an error's message:
// tests/error_of.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/random.h"
#include "meshflow/ops/op.h"

namespace meshflow::testing {

inline Tensor rnd(const Shape& s, std::uint64_t seed, DType dtype = DType::kFloat64) {
  return random_tensor(dtype, s, seed);
}

// Element i of a float32 or float64 tensor.
inline double at(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::kFloat64 ? t.data<double>()[static_cast<std::size_t>(i)]
                                      : t.data<float>()[static_cast<std::size_t>(i)];
}

inline void expect_near(const Tensor& got, const std::vector<double>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size())) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(at(got, static_cast<std::int64_t>(i)), want[i], tol * (1 + std::abs(want[i])))
        << what << " element " << i;
}

inline Tensor run(const Op& op, const std::vector<const Tensor*>& in) { return compute(op, in); }

// Random ids in [0, vocab), repeats included.
inline Tensor ids(const Shape& shape, std::int64_t vocab, DType dtype = DType::kInt64) {
  Tensor t = random_tensor(dtype, shape, 21);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (dtype == DType::kInt64) {
      t.data<std::int64_t>()[k] = ((t.data<std::int64_t>()[k] % vocab) + vocab) % vocab;
    } else {
      t.data<std::int32_t>()[k] =
          static_cast<std::int32_t>(((t.data<std::int32_t>()[k] % vocab) + vocab) % vocab);
    }
  }
  return t;
}

}  // namespace meshflow::testing
