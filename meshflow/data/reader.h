// Reading a split's rows through memory maps: each device copies only the rows and columns of
// its own shard box, so no process holds a whole split and memory does not grow with the data.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/data/dataset.h"

namespace meshflow {

// A file mapped read-only into memory; unmapped on destruction.
class MappedFile {
 public:
  // Returns `path` mapped whole; throws Error(kIo) naming it.
  static MappedFile open(const std::filesystem::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const std::byte* data() const { return data_; }
  std::int64_t size() const { return size_; }
  // Tells the kernel reads will be at random places (no read-around on a fault).
  void expect_random_access() const;
  // Drops this process's mapping of the pages (they stay in the page cache; a later read maps
  // them again), so that what a run has read does not accumulate in its resident set.
  void drop_pages() const;

 private:
  MappedFile(const std::byte* data, std::int64_t size) : data_(data), size_(size) {}
  const std::byte* data_ = nullptr;
  std::int64_t size_ = 0;
};

// A split's files, mapped: what a device reads its boxes from.
class SplitReader {
 public:
  // `random_access`: reads land at random places of the files (the shuffled and random orders).
  explicit SplitReader(const Split& split, bool random_access = false);
  bool is_stream() const { return split_->is_stream(); }

  // Fills `out` ([rows, cols] of int32 or int64) with, for row i, the tokens
  // [starts[i] + offset, starts[i] + offset + cols) of the stream (offset: a shift plus the
  // box's first column; windows may cross file boundaries). Throws Error(kInvalidArgument)
  // naming the file and position of an int64 token that does not fit an int32 `out`.
  void read_windows(std::span<const std::int64_t> starts, std::int64_t offset, Tensor& out) const;

  // Fills `out` ([rows, ...] of the array's dtype) with, for row i, the box of sample
  // samples[i] of array `name` that starts at `trailing_offset` (one entry per trailing dim) and
  // spans out's trailing extents.
  void read_samples(const std::string& name, std::span<const std::int64_t> samples,
                    const std::vector<std::int64_t>& trailing_offset, Tensor& out) const;

 private:
  struct Mapped {
    MappedFile file;
    std::int64_t first_token = 0;  // streams: the stream's index of the file's first token
  };
  // Counts what a read of `rows` rows and `bytes` bytes may have mapped; each time the count
  // passes a multiple of kDropEvery, the maps drop their pages.
  void count_read(std::int64_t rows, std::int64_t bytes) const;
  const Split* split_;
  bool random_access_ = false;
  std::int64_t mapped_bytes_ = 0;  // of every map
  mutable std::atomic<std::int64_t> read_bytes_{0};
  std::vector<Mapped> stream_;
  std::vector<std::pair<std::string, MappedFile>> arrays_;
};

}  // namespace meshflow
