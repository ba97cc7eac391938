// Files: an owned file descriptor with positioned reads and writes that loop until done (one
// read or write moves at most about 2 GiB on Linux), and the protocol every output of meshflow
// follows so that a path holds either its complete old contents or its complete new contents at
// every instant, even when the writer is killed:
//
//   staging_path(target)   a fresh hidden sibling, ".<name>.meshflow-tmp-<pid>-<n>", written in
//                          full first (same folder, so the final move is a rename);
//   publish(staged, target) moves it into place in one atomic step: rename when `target` does
//                          not exist, renameat2(RENAME_EXCHANGE) when it does (then removes the old
//                          contents, now at the staged name);
//   clear_stale(target)    removes the siblings of `target` that a killed meshflow left behind
//                          (their pid no longer runs); every writer calls it before staging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace meshflow {

// An open file descriptor; closes it on destruction. Errors name the path and the system's
// reason (errno read at the failing call).
// The alignment unbuffered (O_DIRECT) writes need of offsets, lengths and memory.
inline constexpr std::int64_t kDirectAlignment = 4096;

class File {
 public:
  // Returns `path` opened for reading; throws Error(kIo) naming it when that fails.
  static File open_read(const std::filesystem::path& path);
  // Returns `path` created (truncated if present) for writing.
  static File create(const std::filesystem::path& path);
  // Returns `path` created for unbuffered writes (O_DIRECT: data goes from the caller's memory
  // to the disk, with no copy through the page cache; offsets, lengths and buffers must then be
  // multiples of kDirectAlignment), or for ordinary writes where the file system refuses
  // O_DIRECT (direct() says which).
  static File create_direct(const std::filesystem::path& path);
  // Returns the existing file `path` opened for writing, its contents kept.
  static File open_write(const std::filesystem::path& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::filesystem::path& path() const { return path_; }
  // Returns the file's size in bytes.
  std::int64_t size() const;
  // Fills `out` from byte `offset`; throws Error(kIo) when the file ends first.
  void read_at(std::int64_t offset, std::span<std::byte> out) const;
  // Fills the buffers of `out` in order from byte `offset` on, the file's bytes scattered
  // across them (preadv: one call for many destinations); throws Error(kIo) when the file ends
  // first.
  void read_scattered(std::int64_t offset, std::span<const std::span<std::byte>> out) const;
  // Writes `data` at byte `offset`.
  void write_at(std::int64_t offset, std::span<const std::byte> data) const;
  // Makes what was written durable (fsync).
  void sync() const;
  // Sets the file's size to `size` bytes.
  void truncate(std::int64_t size) const;
  bool direct() const { return direct_; }
  // Starts writing bytes [offset, offset + length) back to the disk without waiting, so a later
  // sync() has less left to wait for (sync_file_range's SYNC_FILE_RANGE_WRITE; a hint).
  void start_writeback(std::int64_t offset, std::int64_t length) const;

 private:
  File(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::filesystem::path path_;
  bool direct_ = false;
};

// Makes directory `dir`'s entries (files created, renamed or removed in it) durable (fsync of
// the directory); throws Error(kIo) naming it.
void sync_directory(const std::filesystem::path& dir);

// Returns `path` as an output target: trailing separators dropped ("out/" is "out"); throws
// Error(kIo) for an empty path or one naming no file ("/", ".").
std::filesystem::path output_target(const std::filesystem::path& path);

// Returns a fresh staging name for `target` (see the protocol above); creates nothing.
std::filesystem::path staging_path(const std::filesystem::path& target);

// Removes staging siblings of `target` whose writer no longer runs.
void clear_stale(const std::filesystem::path& target);

// Moves `staged` (a file or folder) to `target` atomically, replacing what is there. Throws
// Error(kIo) and removes `staged` when that fails; `target` is then as it was.
void publish(const std::filesystem::path& staged, const std::filesystem::path& target);

// Removes `staged` and everything in it, ignoring errors (the cleanup of a failed write).
void discard(const std::filesystem::path& staged);

// Writes `contents` to `path` by the protocol above.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Returns the contents of `path`; throws Error(kIo) naming it when it cannot be read.
std::string read_file(const std::filesystem::path& path);

}  // namespace meshflow
