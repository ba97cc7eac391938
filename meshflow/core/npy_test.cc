#include "meshflow/core/npy.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"

namespace meshflow {
namespace {

std::string header_v(int major, const std::string& dict) {
  std::string h = dict;
  std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  return out + h;
}

std::string expect_error(const std::string& bytes) {
  try {
    parse_npy(bytes, "x.npy");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  int seed = 0;
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    for (const Shape& s :
         {Shape{}, Shape{0}, Shape{7}, Shape{3, 5}, Shape{2, 0, 3}, Shape{2, 3, 4, 5}}) {
      Tensor t = random_tensor(d, s, ++seed);
      std::string bytes = encode_npy(t);
      EXPECT_EQ((bytes.size() - t.nbytes()) % 64, 0u) << "data is 64-byte aligned";
      Tensor back = parse_npy(bytes, "mem");
      EXPECT_EQ(compare_exact(back, t), std::nullopt) << to_string(d) << " " << to_string(s);
    }
  }
}

TEST(Npy, FileRoundTripLeavesNoTemporary) {
  auto dir = std::filesystem::temp_directory_path() / "meshflow_npy_test";
  std::filesystem::create_directories(dir);
  Tensor t = random_tensor(DType::kFloat32, {9, 4}, 11);
  write_npy(dir / "a.npy", t);
  EXPECT_EQ(compare_exact(read_npy(dir / "a.npy"), t), std::nullopt);
  int files = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

TEST(Npy, ReadsVersions2And3AndNumpyStyleHeaders) {
  std::string data(24, '\0');
  for (int major : {2, 3}) {
    Tensor t = parse_npy(
        header_v(major, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }") + data, "v");
    EXPECT_EQ(t.shape(), Shape{3});
  }
  Tensor t = parse_npy(
      header_v(1, "{\"shape\": (1, 3L), \"fortran_order\": False, \"descr\": \"<f8\"}") + data,
      "v");
  EXPECT_EQ(t.shape(), (Shape{1, 3}));
}

TEST(Npy, RejectsEachMalformation) {
  const std::string f4 = std::string(8, '\0');
  auto ok_dict = [](const std::string& descr, const std::string& order, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  };
  EXPECT_NE(expect_error("hello world").find("bad magic"), std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("<f4", "False", "(2,)")).replace(6, 1, "\x04") + f4)
                .find("version 4.0"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict(">f4", "False", "(2,)")) + f4).find("big-endian"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("|O", "False", "(2,)")) + f4).find("object"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("<f2", "False", "(2,)")) + f4).find("'<f2'"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("<f4", "True", "(2,)")) + f4).find("Fortran"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("<f4", "False", "(3,)")) + f4).find("truncated data"),
            std::string::npos);
  EXPECT_NE(
      expect_error(header_v(1, ok_dict("<f4", "False", "(1,)")) + f4).find("unexpected bytes"),
      std::string::npos);
  EXPECT_NE(expect_error(header_v(1, ok_dict("<f4", "False", "(2, x)")) + f4).find("malformed"),
            std::string::npos);
  EXPECT_NE(expect_error(header_v(1, "{'descr': '<f4', 'shape': (2,), }") + f4).find("lacks"),
            std::string::npos);
  EXPECT_NE(
      expect_error(header_v(1, ok_dict("<f4", "False", "(2,)")).substr(0, 20)).find("truncated"),
      std::string::npos);
  EXPECT_NE(
      expect_error(header_v(1, ok_dict("<f4", "False", "(99999999999, 99999999999, 99999999999)")))
          .find("too large"),
      std::string::npos);
}

TEST(Npy, MissingFileNamesThePath) {
  try {
    read_npy("/nonexistent/dir/x.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.npy"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

TEST(Npy, FilesOverTwoGiBLoadWhole) {
  // Regression: one read() moves at most about 2 GiB on Linux, and a huge file stopped early
  // with the wrong message. A sparse file keeps the test cheap on disk.
  const auto path = std::filesystem::temp_directory_path() / "meshflow_npy_big.npy";
  const std::int64_t count = (std::int64_t{1} << 29) + 4;  // float32: 2 GiB + 16 bytes
  const std::string header = encode_npy_header(DType::kFloat32, {count});
  {
    const File f = File::create(path);
    f.write_at(0, std::as_bytes(std::span<const char>(header.data(), header.size())));
    const float tail = 3.5f;
    f.write_at(static_cast<std::int64_t>(header.size()) + (count - 1) * 4,
               std::as_bytes(std::span<const float>(&tail, 1)));
  }
  const Tensor t = read_npy(path);
  std::filesystem::remove(path);
  ASSERT_EQ(t.numel(), count);
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_EQ(t.data<float>()[count - 1], 3.5f);
}

}  // namespace
}  // namespace meshflow
