#include "meshflow/kernels/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace meshflow {
namespace {

template <class T>
bool on_a_line(const ScratchVector<T>& v) {
  return reinterpret_cast<std::uintptr_t>(v.data()) % kTensorAlignment == 0;
}

// Every size starts on a cache line, where malloc gives 16 bytes (so a 64 KiB block sits 16
// bytes past a page boundary), and grows and copies keep the alignment.
TEST(Scratch, EveryBufferStartsOnACacheLine) {
  for (std::size_t n : {1, 3, 16, 100, 16384, 16385, 1 << 20}) {
    ScratchVector<float> f(n, 1.5f);
    ScratchVector<double> d(n);
    EXPECT_TRUE(on_a_line(f)) << n;
    EXPECT_TRUE(on_a_line(d)) << n;
    EXPECT_EQ(f.back(), 1.5f);
    f.resize(3 * n + 5);
    EXPECT_TRUE(on_a_line(f)) << n;
    const ScratchVector<float> copy = f;
    EXPECT_TRUE(on_a_line(copy)) << n;
    EXPECT_EQ(copy, f);
  }
}

}  // namespace
}  // namespace meshflow
