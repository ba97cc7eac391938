// SHA-256 through OpenSSL's EVP interface.
#include "meshflow/core/sha256.h"

#include <openssl/evp.h>

#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"

namespace meshflow {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
  ~State() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  MESHFLOW_CHECK(state_->ctx != nullptr && EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr),
                 "SHA-256 init");
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(std::span<const std::byte> bytes) {
  MESHFLOW_CHECK(EVP_DigestUpdate(state_->ctx, bytes.data(), bytes.size()), "SHA-256 update");
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  MESHFLOW_CHECK(EVP_DigestFinal_ex(state_->ctx, digest, &n), "SHA-256 final");
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kDigits[digest[i] >> 4];
    out += kDigits[digest[i] & 15];
  }
  return out;
}

std::string sha256_file(const std::filesystem::path& path) {
  const File file = File::open_read(path);
  const std::int64_t size = file.size();
  constexpr std::int64_t kSlab = std::int64_t{8} << 20;
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min(size, kSlab)));
  Sha256 h;
  for (std::int64_t at = 0; at < size; at += kSlab) {
    const std::span<std::byte> slab(buf.data(),
                                    static_cast<std::size_t>(std::min(kSlab, size - at)));
    file.read_at(at, slab);
    h.update(slab);
  }
  return h.hex();
}

}  // namespace meshflow
