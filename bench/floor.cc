#include "bench/floor.h"

#include <algorithm>
#include <cstring>

#include "meshflow/core/error.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/kernels/vector_math.h"

namespace meshflow::bench {

namespace {

constexpr std::int64_t kF = sizeof(float);

}  // namespace

MemoryFloor::MemoryFloor(const std::vector<FloorRead>& reads, std::int64_t writes)
    : to_(Tensor::uninitialized(DType::kFloat32,
                                {std::max<std::int64_t>(1, (writes + kF - 1) / kF)})) {
  // Faulted in before the first run, and not zero: the bytes run() zeroes are its doing.
  std::memset(to_.bytes(), 0xff, to_.nbytes());
  std::byte* to = to_.bytes();
  std::int64_t room = writes;
  for (const FloorRead& r : reads) {
    const auto size = static_cast<std::int64_t>(r.from->nbytes());
    const std::int64_t n = r.bytes < 0 ? size : r.bytes;
    MESHFLOW_CHECK(n % kF == 0 && n <= size, "a floor's read of {} bytes of {}", n, size);
    const std::int64_t copied = std::min(n, room);
    if (copied > 0) pieces_.push_back({r.from->bytes(), to, copied});
    if (n > copied) pieces_.push_back({r.from->bytes() + copied, nullptr, n - copied});
    to += copied;
    room -= copied;
    bytes_ += n;
  }
  if (room > 0) pieces_.push_back({nullptr, to, room});
  bytes_ += writes;
}

void MemoryFloor::run() {
  const int parts = team_threads();
  std::vector<float> sums(static_cast<std::size_t>(parts));
  parallel_parts_for(parts, parts, [&](int part, std::int64_t, std::int64_t) {
    float sum = 0;
    for (const Piece& p : pieces_) {
      // Whole cache lines per part; a read piece's bounds stay on floats.
      const std::int64_t begin = part_begin(p.bytes, parts, part, 64);
      const std::int64_t n = part_begin(p.bytes, parts, part + 1, 64) - begin;
      if (n == 0) continue;
      if (p.from == nullptr) {
        std::memset(p.to + begin, 0, static_cast<std::size_t>(n));
      } else if (p.to == nullptr) {
        sum += vector_math().sum(reinterpret_cast<const float*>(p.from + begin), n / kF);
      } else {
        std::memcpy(p.to + begin, p.from + begin, static_cast<std::size_t>(n));
      }
    }
    sums[static_cast<std::size_t>(part)] = sum;
  });
  float total = 0;
  for (float s : sums) total += s;
  sink_ = total;
}

}  // namespace meshflow::bench
