#include "meshflow/core/copy.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "meshflow/core/error.h"
#include "meshflow/core/shape.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace meshflow {

namespace {

// The unit streaming stores write whole: one cache line.
constexpr std::size_t kLineBytes = 64;

void check_region(const Shape& shape, const std::vector<std::int64_t>& offset,
                  const std::vector<std::int64_t>& extent, const char* which) {
  MESHFLOW_CHECK(shape.size() == offset.size() && offset.size() == extent.size(),
                 "copy_box {} rank mismatch", which);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    MESHFLOW_CHECK(extent[d] >= 0 && offset[d] >= 0 && offset[d] + extent[d] <= shape[d],
                   "copy_box {} region {} outside shape {}", which, to_string(Box{offset, extent}),
                   to_string(shape));
  }
}

// Reads one sysfs cache attribute ("32768K", "3", "Unified"); empty when absent.
std::string read_attribute(const std::string& path) {
  std::ifstream in(path);
  std::string value;
  in >> value;
  return value;
}

// Parses a sysfs cache size ("512K", "32M" or plain bytes); 0 when malformed.
std::int64_t parse_cache_size(const std::string& text) {
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value <= 0 || value > (std::int64_t{1} << 40)) return 0;
  const std::string_view unit(end, text.data() + text.size() - end);
  if (unit.empty()) return value;
  if (unit == "K") return value << 10;
  if (unit == "M") return value << 20;
  if (unit == "G") return value << 30;
  return 0;
}

std::int64_t sysfs_largest_data_cache() {
  std::int64_t largest = 0;
  for (int i = 0;; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string type = read_attribute(dir + "type");
    if (type.empty()) break;
    if (type == "Data" || type == "Unified")
      largest = std::max(largest, parse_cache_size(read_attribute(dir + "size")));
  }
  return largest;
}

}  // namespace

void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n, Store store) {
#if defined(__SSE2__)
  if (store == Store::kStreaming && n >= 2 * kLineBytes) {
    // Ordinary stores up to the destination's next line boundary, whole lines streamed, then
    // ordinary stores for the tail: a partly streamed line would be written to memory in parts.
    const std::size_t head =
        (kLineBytes - reinterpret_cast<std::uintptr_t>(dst) % kLineBytes) % kLineBytes;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= kLineBytes; n -= kLineBytes, dst += kLineBytes, src += kLineBytes) {
      const auto* s = reinterpret_cast<const __m128i*>(src);
      auto* d = reinterpret_cast<__m128i*>(dst);
      const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1), c = _mm_loadu_si128(s + 2),
                    e = _mm_loadu_si128(s + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
  }
#else
  (void)store;
#endif
  if (n > 0) std::memcpy(dst, src, n);
}

void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

std::int64_t last_level_cache_bytes() {
  static const std::int64_t bytes = [] {
    if (const std::int64_t b = sysfs_largest_data_cache(); b > 0) return b;
    for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
      if (const long b = sysconf(name); b > 0) return static_cast<std::int64_t>(b);
    }
    return std::int64_t{0};
  }();
  return bytes;
}

Store store_for_copy_of(std::int64_t bytes) {
  const std::int64_t cache = last_level_cache_bytes();
  return cache > 0 && bytes >= cache / 2 ? Store::kStreaming : Store::kCached;
}

BoxCopy prepare_box_copy(ConstBuffer src, const std::vector<std::int64_t>& src_offset,
                         MutableBuffer dst, const std::vector<std::int64_t>& dst_offset,
                         const std::vector<std::int64_t>& extent) {
  MESHFLOW_CHECK(src.elem_size == dst.elem_size);
  check_region(*src.shape, src_offset, extent, "source");
  check_region(*dst.shape, dst_offset, extent, "destination");
  const std::size_t rank = extent.size();
  MESHFLOW_CHECK(rank <= static_cast<std::size_t>(kMaxTensorRank), "copy_box rank {}", rank);
  BoxCopy c;
  c.rank = rank;
  std::array<std::int64_t, kMaxTensorRank> src_strides, dst_strides;
  row_major_strides(*src.shape, src_strides);
  row_major_strides(*dst.shape, dst_strides);
  const auto es = static_cast<std::int64_t>(src.elem_size);
  std::int64_t src_base = 0, dst_base = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    c.extent[d] = extent[d];
    c.src_step[d] = src_strides[d] * es;
    c.dst_step[d] = dst_strides[d] * es;
    src_base += src_offset[d] * c.src_step[d];
    dst_base += dst_offset[d] * c.dst_step[d];
  }
  c.src = src.data + src_base;
  c.dst = dst.data + dst_base;
  // Merge trailing dims: dims [split, rank) form one contiguous run in both buffers when every
  // dim after `split` is spanned fully by the region in both shapes.
  c.split = rank;
  std::int64_t run = 1;  // elements per contiguous run
  while (c.split > 0) {
    const std::size_t d = c.split - 1;
    run *= extent[d];
    --c.split;
    if (extent[d] != (*src.shape)[d] || extent[d] != (*dst.shape)[d]) break;
  }
  // An empty region copies nothing, even where its empty dim lies outside the run.
  c.run_bytes = meshflow::numel(extent) == 0 ? 0 : static_cast<std::size_t>(run * es);
  return c;
}

std::int64_t box_copy_rows(const BoxCopy& copy) { return copy.rank == 0 ? 1 : copy.extent[0]; }

void run_box_copy(const BoxCopy& c, std::int64_t first, std::int64_t count, Store store) {
  if (count <= 0 || c.run_bytes == 0) return;
  if (c.split == 0) {
    // The whole region is one run; its rows are equal parts of it.
    const std::size_t row = c.rank == 0 ? c.run_bytes : c.run_bytes / c.extent[0];
    copy_bytes(c.dst + first * static_cast<std::int64_t>(row),
               c.src + first * static_cast<std::int64_t>(row), row * count, store);
    return;
  }
  // Odometer over the outer dims [0, split - 1), dim 0 limited to the rows asked for; the
  // innermost outer dim is a tight loop.
  std::array<std::int64_t, kMaxTensorRank> extent, index;
  std::copy_n(c.extent.begin(), c.split, extent.begin());
  extent[0] = count;
  const std::byte* s = c.src + first * c.src_step[0];
  std::byte* t = c.dst + first * c.dst_step[0];
  const std::size_t inner = c.split - 1;
  const std::int64_t inner_count = extent[inner];
  const std::int64_t s_step = c.src_step[inner], t_step = c.dst_step[inner];
  std::fill_n(index.begin(), inner, 0);
  while (true) {
    const std::byte* si = s;
    std::byte* ti = t;
    for (std::int64_t i = 0; i < inner_count; ++i, si += s_step, ti += t_step)
      copy_bytes(ti, si, c.run_bytes, store);
    std::size_t d = inner;
    while (true) {
      if (d == 0) return;
      --d;
      if (++index[d] < extent[d]) {
        s += c.src_step[d];
        t += c.dst_step[d];
        break;
      }
      s -= (extent[d] - 1) * c.src_step[d];
      t -= (extent[d] - 1) * c.dst_step[d];
      index[d] = 0;
    }
  }
}

}  // namespace meshflow
