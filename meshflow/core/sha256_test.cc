// SHA-256 against FIPS 180-2's test vectors, fed whole and in pieces, and of a file.
#include "meshflow/core/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace meshflow {
namespace {

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(Sha256, MatchesTheStandardsVectorsWholeOrInPieces) {
  Sha256 empty;
  EXPECT_EQ(empty.hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update(bytes("abc"));
  EXPECT_EQ(abc.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string long_text = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256 pieces;
  for (std::size_t i = 0; i < long_text.size(); i += 7)
    pieces.update(bytes(long_text.substr(i, 7)));
  EXPECT_EQ(pieces.hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("meshflow_sha_" + std::to_string(::getpid()));
  std::ofstream(file) << "abc";
  EXPECT_EQ(sha256_file(file), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace meshflow
