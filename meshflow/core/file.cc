// File descriptors, positioned I/O and the atomic output protocol.
#include "meshflow/core/file.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <vector>

#include "meshflow/core/error.h"

namespace meshflow {

namespace fs = std::filesystem;

namespace {

// Returns the system's text for errno value `code` (captured by the caller right after the
// failing call, so nothing in between can reset it).
std::string reason(int code) { return std::strerror(code); }

// The most bytes one read or write is asked to move; Linux moves at most 0x7ffff000 per call.
constexpr std::size_t kMaxIoChunk = std::size_t{1} << 30;

constexpr std::string_view kStagingMark = ".meshflow-tmp-";

}  // namespace

File File::open_read(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int code = errno;
    fail(ErrorKind::kIo, "cannot open \"{}\": {}", path.string(), reason(code));
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::kIo, "\"{}\" is a directory, not a file", path.string());
  }
  return File(fd, path);
}

File File::create(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int code = errno;
    fail(ErrorKind::kIo, "cannot create \"{}\": {}", path.string(), reason(code));
  }
  return File(fd, path);
}

File File::create_direct(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) return create(path);  // e.g. tmpfs
  if (fd < 0) {
    const int code = errno;
    fail(ErrorKind::kIo, "cannot create \"{}\": {}", path.string(), reason(code));
  }
  File f(fd, path);
  f.direct_ = true;
  return f;
}

void File::truncate(std::int64_t size) const {
  if (::ftruncate(fd_, size) != 0)
    fail(ErrorKind::kIo, "cannot resize \"{}\": {}", path_.string(), reason(errno));
}

File File::open_write(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int code = errno;
    fail(ErrorKind::kIo, "cannot open \"{}\" for writing: {}", path.string(), reason(code));
  }
  return File(fd, path);
}

File::File(File&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), direct_(other.direct_) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

std::int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int code = errno;
    fail(ErrorKind::kIo, "cannot stat \"{}\": {}", path_.string(), reason(code));
  }
  return static_cast<std::int64_t>(st.st_size);
}

void File::read_at(std::int64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const std::size_t want = std::min(out.size() - done, kMaxIoChunk);
    const ssize_t got = ::pread(fd_, out.data() + done, want, offset + done);
    if (got < 0) {
      const int code = errno;
      if (code == EINTR) continue;
      fail(ErrorKind::kIo, "cannot read \"{}\": {}", path_.string(), reason(code));
    }
    if (got == 0) {
      fail(ErrorKind::kIo, "\"{}\" ends at byte {} but {} bytes were expected", path_.string(),
           offset + done, offset + out.size());
    }
    done += static_cast<std::size_t>(got);
  }
}

void File::read_scattered(std::int64_t offset, std::span<const std::span<std::byte>> out) const {
  constexpr std::size_t kBatch = IOV_MAX;
  std::vector<iovec> iov;
  std::size_t next = 0;
  std::size_t skip = 0;  // bytes of out[next] already filled
  while (next < out.size()) {
    iov.clear();
    for (std::size_t i = next; i < out.size() && iov.size() < kBatch; ++i) {
      const std::size_t from = i == next ? skip : 0;
      iov.push_back({out[i].data() + from, out[i].size() - from});
    }
    const ssize_t got = ::preadv(fd_, iov.data(), static_cast<int>(iov.size()), offset);
    if (got < 0) {
      const int code = errno;
      if (code == EINTR) continue;
      fail(ErrorKind::kIo, "cannot read \"{}\": {}", path_.string(), reason(code));
    }
    if (got == 0) fail(ErrorKind::kIo, "\"{}\" ends at byte {}", path_.string(), offset);
    offset += got;
    auto left = static_cast<std::size_t>(got);
    while (left > 0) {
      const std::size_t room = out[next].size() - skip;
      if (left < room) {
        skip += left;
        left = 0;
      } else {
        left -= room;
        ++next;
        skip = 0;
      }
    }
    while (next < out.size() && out[next].size() == skip) {
      ++next;
      skip = 0;
    }
  }
}

void File::write_at(std::int64_t offset, std::span<const std::byte> data) const {
  std::size_t done = 0;
  while (done < data.size()) {
    const std::size_t want = std::min(data.size() - done, kMaxIoChunk);
    const ssize_t put = ::pwrite(fd_, data.data() + done, want, offset + done);
    if (put < 0) {
      const int code = errno;
      if (code == EINTR) continue;
      fail(ErrorKind::kIo, "cannot write \"{}\": {}", path_.string(), reason(code));
    }
    done += static_cast<std::size_t>(put);
  }
}

void File::sync() const {
  if (::fsync(fd_) != 0)
    fail(ErrorKind::kIo, "cannot sync \"{}\": {}", path_.string(), reason(errno));
}

void File::start_writeback(std::int64_t offset, std::int64_t length) const {
  ::sync_file_range(fd_, offset, length, SYNC_FILE_RANGE_WRITE);  // a hint: failures are sync's
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open \"{}\": {}", dir.string(), reason(errno));
  const int rc = ::fsync(fd);
  const int code = errno;
  ::close(fd);
  if (rc != 0) fail(ErrorKind::kIo, "cannot sync \"{}\": {}", dir.string(), reason(code));
}

fs::path output_target(const fs::path& path) {
  std::string text = path.string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  const fs::path out(text);
  if (text.empty() || text == "/" || out.filename() == "." || out.filename() == "..") {
    fail(ErrorKind::kIo, "\"{}\" does not name a file or folder to write", path.string());
  }
  return out;
}

namespace {

fs::path parent_of(const fs::path& target) {
  return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

// Returns the pid a staging name of `target` carries, or 0 when `name` is not one.
pid_t staging_pid(const fs::path& target, const std::string& name) {
  const std::string prefix = "." + target.filename().string() + std::string(kStagingMark);
  if (name.rfind(prefix, 0) != 0) return 0;
  pid_t pid = 0;
  const char* begin = name.data() + prefix.size();
  auto [end, ec] = std::from_chars(begin, name.data() + name.size(), pid);
  if (ec != std::errc() || end == begin || *end != '-') return 0;
  return pid;
}

}  // namespace

fs::path staging_path(const fs::path& target) {
  static std::atomic<int> counter{0};
  return parent_of(target) /
         fmt::format(".{}{}{}-{}", target.filename().string(), kStagingMark, ::getpid(), counter++);
}

void clear_stale(const fs::path& target) {
  std::error_code ec;
  for (fs::directory_iterator it(parent_of(target), ec), end; !ec && it != end; it.increment(ec)) {
    const pid_t pid = staging_pid(target, it->path().filename().string());
    if (pid <= 0) continue;
    if (pid == ::getpid()) continue;  // this process's own (another writer thread's) staging
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer still runs
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

void discard(const fs::path& staged) {
  std::error_code ignored;
  fs::remove_all(staged, ignored);
}

void publish(const fs::path& staged, const fs::path& target) {
  std::error_code ec;
  if (fs::exists(target, ec) && fs::is_directory(target, ec) != fs::is_directory(staged, ec)) {
    discard(staged);
    fail(ErrorKind::kIo, "refusing to replace \"{}\": it is a {}", target.string(),
         fs::is_directory(target, ec) ? "folder" : "file");
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0)
    return;
  int code = errno;
  if (code == EEXIST) {
    // Swap in one step: `target` now holds the new contents and `staged` the old ones.
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      discard(staged);
      return;
    }
    code = errno;
  }
  discard(staged);
  fail(ErrorKind::kIo, "cannot move the new contents into \"{}\": {}", target.string(),
       reason(code));
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  const fs::path target = output_target(path);
  const fs::path staged = staging_path(target);
  try {
    File::create(staged).write_at(
        0, std::as_bytes(std::span<const char>(contents.data(), contents.size())));
  } catch (...) {
    discard(staged);
    throw;
  }
  publish(staged, target);
}

std::string read_file(const fs::path& path) {
  const File file = File::open_read(path);
  std::string out(static_cast<std::size_t>(file.size()), '\0');
  file.read_at(0, std::as_writable_bytes(std::span<char>(out.data(), out.size())));
  return out;
}

}  // namespace meshflow
