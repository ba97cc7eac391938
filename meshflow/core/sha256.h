// SHA-256 (OpenSSL's libcrypto), fed as bytes are written or read, so a file is hashed in the
// same pass that writes it: checkpoints record each file's digest and verify it on load.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

namespace meshflow {

// A running SHA-256; owns libcrypto's context.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(std::span<const std::byte> bytes);
  // Returns the digest of every byte fed, as 64 lowercase hex digits; the hash is done.
  std::string hex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Returns the SHA-256 of the file at `path` (read in slabs); throws Error(kIo) naming it.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace meshflow
