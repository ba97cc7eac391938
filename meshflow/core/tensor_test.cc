#include "meshflow/core/tensor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <vector>

#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"

namespace meshflow {
namespace {

TEST(Tensor, StorageIsAlignedAndZeroed) {
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{3, 5}, Shape{7, 0, 2}}) {
    Tensor t(DType::kFloat64, shape);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.bytes()) % kTensorAlignment, 0u);
    for (double x : t.data<double>()) EXPECT_EQ(x, 0.0);
  }
}

// Large buffers start on a 2 MiB boundary so the kernel can back them with huge pages (tensor.cc),
// including ones handed back by the buffer cache; a 5 MiB tensor (not a multiple of
// 2 MiB) is zeroed to its last element.
TEST(Tensor, LargeStorageStartsOnAHugePageBoundary) {
  for (int round = 0; round < 2; ++round) {
    Tensor t(DType::kFloat32, {5 << 18});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.bytes()) % (std::uintptr_t{2} << 20), 0u);
    EXPECT_EQ(t.data<float>().back(), 0.0f);
    t.data<float>().back() = 1.5f;
  }
}

// Returns the page faults the calling thread has taken so far.
long page_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt + u.ru_majflt;
}

// Freed buffers come back for the next tensors of their sizes however many there are (a GPT step
// on 4 device threads has about 200 waiting at once): the second round of 120 distinct sizes
// (1-1.5 MiB, about 150 MiB in all) touches only memory already faulted in. When at most 64
// buffers were kept, the first 56 of the second round faulted in again (about 280 pages each).
TEST(Tensor, FreedBuffersOfEverySizeComeBackFaultedIn) {
  constexpr int kBuffers = 120;
  auto round = [] {
    std::vector<Tensor> live;
    for (int i = 0; i < kBuffers; ++i) {
      live.push_back(Tensor::uninitialized(DType::kFloat32, {(1 << 18) + 1024 * i}));
      for (float& x : live.back().data<float>()) x = 0.5f;
    }
  };
  round();
  const long before = page_faults();
  round();
  EXPECT_LT(page_faults() - before, 256);
}

// A reshape that takes the buffer: the same bytes under the new shape, the source left empty;
// a different element count is an error naming both shapes.
TEST(Tensor, ReshapedTakesTheBufferWithoutCopying) {
  Tensor t(DType::kFloat32, {2, 6});
  for (std::size_t i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i) * 0.5f - 1;
  const std::byte* storage = t.bytes();
  const Tensor r = Tensor::reshaped(std::move(t), {3, 2, 2});
  EXPECT_EQ(r.shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(r.bytes(), storage);
  for (std::size_t i = 0; i < 12; ++i)
    EXPECT_EQ(r.data<float>()[i], static_cast<float>(i) * 0.5f - 1);
  EXPECT_EQ(t.nbytes(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  Tensor u(DType::kFloat32, {2, 6});
  try {
    (void)Tensor::reshaped(std::move(u), {5});
    ADD_FAILURE() << "a reshape to fewer elements was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 elements 2x6 to 5"), std::string::npos) << e.what();
  }
}

TEST(Tensor, WrongElementTypeIsAnError) {
  Tensor t(DType::kInt32, {4});
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(Tensor(DType::kFloat32, {-1}), Error);
}

TEST(Random, SameSeedSameBitsDifferentSeedDifferentBits) {
  Tensor a = random_tensor(DType::kFloat32, {64}, 7);
  Tensor b = random_tensor(DType::kFloat32, {64}, 7);
  Tensor c = random_tensor(DType::kFloat32, {64}, 8);
  EXPECT_EQ(compare_exact(a, b), std::nullopt);
  EXPECT_NE(compare_exact(a, c), std::nullopt);
  for (float x : a.data<float>()) {
    EXPECT_GE(x, -1.0f);
    EXPECT_LT(x, 1.0f);
  }
  Tensor i = random_tensor(DType::kInt64, {1000}, 1);
  std::int64_t distinct_signs = 0;
  for (auto x : i.data<std::int64_t>()) distinct_signs += x < 0 ? 1 : 0;
  EXPECT_GT(distinct_signs, 100);
}

TEST(Compare, CloseAcceptsRoundingButNamesTheWorstElement) {
  Tensor a = random_tensor(DType::kFloat32, {16}, 3);
  Tensor b = a.clone();
  b.data<float>()[5] += 1e-7f;
  EXPECT_NE(compare_exact(a, b), std::nullopt);
  EXPECT_EQ(compare_close(a, b, 1e-5, 1e-6), std::nullopt);
  b.data<float>()[9] += 0.5f;
  auto diff = compare_close(a, b, 1e-5, 1e-6);
  ASSERT_TRUE(diff.has_value());
  EXPECT_NE(diff->find("element 9"), std::string::npos) << *diff;
}

TEST(Compare, MaxAbsDifferenceIsTheLargestElementwiseGap) {
  Tensor a = random_tensor(DType::kFloat64, {3, 4}, 7);
  Tensor b = a.clone();
  EXPECT_EQ(max_abs_difference(a, b), 0.0);
  b.data<double>()[2] -= 0.25;
  b.data<double>()[10] += 0.75;
  EXPECT_DOUBLE_EQ(max_abs_difference(a, b), 0.75);
  EXPECT_THROW(max_abs_difference(a, random_tensor(DType::kFloat64, {4, 3}, 7)), Error);
}

}  // namespace
}  // namespace meshflow
