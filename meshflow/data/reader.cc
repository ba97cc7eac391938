// Memory maps and the box copies out of them.
#include "meshflow/data/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "meshflow/core/box.h"
#include "meshflow/core/error.h"

namespace meshflow {

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path.string(), std::strerror(errno));
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot read its size: {}", path.string(), std::strerror(err));
  }
  void* p = nullptr;
  if (size > 0) {
    p = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(ErrorKind::kIo, "{}: cannot map: {}", path.string(), std::strerror(err));
    }
  }
  ::close(fd);
  return MappedFile(static_cast<const std::byte*>(p), size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_));
}

void MappedFile::expect_random_access() const {
  if (data_) ::madvise(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_), MADV_RANDOM);
}

void MappedFile::drop_pages() const {
  if (data_)
    ::madvise(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_), MADV_DONTNEED);
}

namespace {

// The bytes a reader may have mapped before it drops its maps' pages: what a run has read then
// stays a bounded part of its resident set however large the data. Maps that are smaller
// together are never dropped.
constexpr std::int64_t kDropEvery = std::int64_t{32} << 20;

// The bytes one read at a random place may map: the page cache holds a file in folios of up to
// 2 MiB and a fault maps a whole folio, advice or not (measured on a 2 GiB stream: random
// windows of 1 KiB grew the resident set by about 1 MiB each).
constexpr std::int64_t kRandomReadMaps = std::int64_t{2} << 20;

}  // namespace

SplitReader::SplitReader(const Split& split, bool random_access)
    : split_(&split), random_access_(random_access) {
  std::int64_t first = 0;
  for (const StreamFile& f : split.stream) {
    stream_.push_back({MappedFile::open(f.path), first});
    if (random_access) stream_.back().file.expect_random_access();
    first += f.tokens;
    mapped_bytes_ += stream_.back().file.size();
  }
  for (const auto& [name, a] : split.arrays) {
    arrays_.emplace_back(name, MappedFile::open(a.path));
    mapped_bytes_ += arrays_.back().second.size();
  }
}

void SplitReader::count_read(std::int64_t rows, std::int64_t bytes) const {
  if (mapped_bytes_ <= kDropEvery) return;
  const std::int64_t maps = random_access_ ? rows * kRandomReadMaps : bytes;
  const std::int64_t before = read_bytes_.fetch_add(maps);
  if (before / kDropEvery == (before + maps) / kDropEvery) return;
  for (const Mapped& m : stream_) m.file.drop_pages();
  for (const auto& [name, f] : arrays_) f.drop_pages();
}

namespace {

// Returns `count` tokens of type In at `src` converted into `dst`: the index of the first that
// does not fit Out, or count. In's alignment is the caller's (a map is page-aligned and a
// token's offset a multiple of its size).
template <typename In, typename Out>
std::int64_t convert_tokens(const std::byte* src, std::int64_t count, Out* dst) {
  const In* in = reinterpret_cast<const In*>(src);
  if constexpr (std::is_same_v<In, Out>) {
    std::memcpy(dst, in, static_cast<std::size_t>(count) * sizeof(In));
  } else if constexpr (sizeof(In) > sizeof(Out)) {
    for (std::int64_t i = 0; i < count; ++i) {
      if (in[i] < std::numeric_limits<Out>::min() || in[i] > std::numeric_limits<Out>::max())
        return i;
      dst[i] = static_cast<Out>(in[i]);
    }
  } else {
    for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<Out>(in[i]);
  }
  return count;
}

template <typename Out>
std::int64_t convert_tokens(const std::byte* src, int item_bytes, std::int64_t count, Out* dst) {
  switch (item_bytes) {
    case 2:
      return convert_tokens<std::uint16_t>(src, count, dst);
    case 4:
      return convert_tokens<std::int32_t>(src, count, dst);
    default:
      return convert_tokens<std::int64_t>(src, count, dst);
  }
}

}  // namespace

void SplitReader::read_windows(std::span<const std::int64_t> starts, std::int64_t offset,
                               Tensor& out) const {
  MESHFLOW_CHECK(out.shape().size() == 2 &&
                 static_cast<std::size_t>(out.shape()[0]) == starts.size());
  const std::int64_t cols = out.shape()[1];
  auto fill = [&](auto zero) {
    using Out = decltype(zero);
    Out* dst = out.data<Out>().data();
    for (std::size_t r = 0; r < starts.size(); ++r, dst += cols) {
      std::int64_t token = starts[r] + offset;
      std::int64_t done = 0;
      // The file holding `token`: the last whose first token is at or before it.
      auto it = std::upper_bound(stream_.begin(), stream_.end(), token,
                                 [](std::int64_t t, const Mapped& m) { return t < m.first_token; });
      MESHFLOW_CHECK(it != stream_.begin());
      --it;
      while (done < cols) {
        const StreamFile& f = split_->stream[static_cast<std::size_t>(it - stream_.begin())];
        const std::int64_t at = token - it->first_token;
        const std::int64_t n = std::min(cols - done, f.tokens - at);
        MESHFLOW_CHECK(n > 0, "window at token {} runs past the stream", token);
        const std::byte* src = it->file.data() + f.offset + at * f.item_bytes;
        const std::int64_t ok = convert_tokens(src, f.item_bytes, n, dst + done);
        if (ok < n) {
          fail(
              ErrorKind::kInvalidArgument, "{}: token {} ({}) does not fit {}", f.path.string(),
              at + ok,
              [&] {
                std::int64_t v;
                std::memcpy(&v, src + 8 * ok, 8);
                return v;
              }(),
              to_string(out.dtype()));
        }
        done += n;
        token += n;
        ++it;
      }
    }
  };
  std::int64_t item = 0;
  for (const StreamFile& f : split_->stream) item = std::max<std::int64_t>(item, f.item_bytes);
  if (out.dtype() == DType::kInt32) {
    fill(std::int32_t{});
  } else {
    MESHFLOW_CHECK(out.dtype() == DType::kInt64);
    fill(std::int64_t{});
  }
  const auto rows = static_cast<std::int64_t>(starts.size());
  count_read(rows, rows * cols * item);
}

void SplitReader::read_samples(const std::string& name, std::span<const std::int64_t> samples,
                               const std::vector<std::int64_t>& trailing_offset,
                               Tensor& out) const {
  const SampleArray& a = split_->arrays.at(name);
  const MappedFile* file = nullptr;
  for (const auto& [n, f] : arrays_)
    if (n == name) file = &f;
  MESHFLOW_CHECK(file != nullptr && a.dtype == out.dtype());
  const Shape sample(a.shape.begin() + 1, a.shape.end());
  const Shape out_sample(out.shape().begin() + 1, out.shape().end());
  std::int64_t sample_elems = 1;
  for (std::int64_t d : sample) sample_elems *= d;
  std::int64_t out_elems = 1;
  for (std::int64_t d : out_sample) out_elems *= d;
  const std::size_t elem = size_of(a.dtype);
  const std::vector<std::int64_t> zero(out_sample.size(), 0);
  for (std::size_t r = 0; r < samples.size(); ++r) {
    const std::byte* src =
        file->data() + a.offset + samples[r] * sample_elems * static_cast<std::int64_t>(elem);
    std::byte* dst =
        out.bytes() + static_cast<std::int64_t>(r) * out_elems * static_cast<std::int64_t>(elem);
    if (out_sample == sample) {
      std::memcpy(dst, src, static_cast<std::size_t>(out_elems) * elem);
    } else {
      copy_box(ConstBuffer{src, &sample, elem}, trailing_offset,
               MutableBuffer{dst, &out_sample, elem}, zero, out_sample);
    }
  }
  const auto rows = static_cast<std::int64_t>(samples.size());
  count_read(rows, rows * sample_elems * static_cast<std::int64_t>(elem));
}

}  // namespace meshflow
