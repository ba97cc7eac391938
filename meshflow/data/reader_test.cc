#include "meshflow/data/reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "../../tests/error_of.h"
#include "meshflow/core/npy.h"
#include "meshflow/data/batch.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshflow_data_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a 1-d .npy of `descr` holding `values` (cast to the descr's width).
  fs::path stream_npy(const std::string& name, const std::string& descr,
                      const std::vector<std::int64_t>& values) {
    const std::size_t width = static_cast<std::size_t>(descr.back() - '0');
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({},), }}",
                                   descr, values.size());
    std::string header("\x93NUMPY\x01\x00", 8);
    const std::size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
    dict.append(total - 10 - dict.size() - 1, ' ');
    dict += '\n';
    header += static_cast<char>(dict.size() & 0xff);
    header += static_cast<char>(dict.size() >> 8);
    header += dict;
    for (std::int64_t v : values) header.append(reinterpret_cast<const char*>(&v), width);
    return write(name, header);
  }

  fs::path bin(const std::string& name, const std::vector<std::uint16_t>& values,
               std::int32_t magic = 20240520, std::int32_t count = -1) {
    std::vector<std::int32_t> head(256, 0);
    head[0] = magic;
    head[1] = 1;
    head[2] = count >= 0 ? count : static_cast<std::int32_t>(values.size());
    std::string bytes(reinterpret_cast<const char*>(head.data()), 1024);
    bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * 2);
    return write(name, bytes);
  }

  fs::path write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }

  fs::path dir_;
};

TEST_F(DataFiles, WindowsCrossFilesOfEveryTokenFormat) {
  stream_npy("a.npy", "<u2", {0, 1, 2, 60000, 4});
  bin("b.bin", {5, 6, 7});
  stream_npy("c.npy", "<i8", {8, 9, 10, 11});
  const nlohmann::json j = {{"train", {"a.npy", "b.bin", "c.npy"}}};
  const DataSpec spec = parse_data_spec(JsonField(j, "m.json"), dir_);
  EXPECT_EQ(spec.train.size(), 12);
  const SplitReader reader(spec.train);
  for (DType d : {DType::kInt32, DType::kInt64}) {
    Tensor out = Tensor::uninitialized(d, {3, 4});
    reader.read_windows(std::vector<std::int64_t>{0, 2, 7}, 1, out);
    std::vector<std::int64_t> got;
    visit_dtype(d, [&](auto zero) {
      for (auto v : out.data<decltype(zero)>()) got.push_back(static_cast<std::int64_t>(v));
    });
    EXPECT_EQ(got, (std::vector<std::int64_t>{1, 2, 60000, 4, 60000, 4, 5, 6, 8, 9, 10, 11}));
  }
}

TEST_F(DataFiles, Int64TokensThatDoNotFitInt32AreNamed) {
  stream_npy("big.npy", "<i8", {1, std::int64_t{1} << 40, 3});
  const nlohmann::json j = {{"train", "big.npy"}};
  const DataSpec spec = parse_data_spec(JsonField(j, "m.json"), dir_);
  Tensor out = Tensor::uninitialized(DType::kInt32, {1, 3});
  EXPECT_NE(error_of([&] {
              SplitReader(spec.train).read_windows(std::vector<std::int64_t>{0}, 0, out);
            }).find("big.npy: token 1 (1099511627776) does not fit int32"),
            std::string::npos);
}

TEST_F(DataFiles, BrokenStreamsAreOneLineNamingTheFile) {
  bin("magic.bin", {1, 2}, 123);
  bin("count.bin", {1, 2}, 20240520, 5);
  stream_npy("float.npy", "<f4", {1, 2});
  write("two_d.npy", encode_npy_header(DType::kInt64, {2, 2}) + std::string(32, '\0'));
  auto err = [&](const std::string& file) {
    const nlohmann::json j = {{"train", file}};
    return error_of([&] { parse_data_spec(JsonField(j, "m.json"), dir_); });
  };
  EXPECT_NE(err("magic.bin").find("magic 123, expected 20240520"), std::string::npos)
      << err("magic.bin");
  EXPECT_NE(err("count.bin").find("counts 5 tokens but the file holds 4 bytes"), std::string::npos)
      << err("count.bin");
  EXPECT_NE(err("float.npy").find("unsupported dtype descr '<f4' (expected <u2, <i4, <i8)"),
            std::string::npos)
      << err("float.npy");
  EXPECT_NE(err("two_d.npy").find("a token stream is 1-d"), std::string::npos) << err("two_d.npy");
  EXPECT_NE(err("missing.npy").find("missing.npy"), std::string::npos);
}

TEST_F(DataFiles, SampleBoxesReadTheirTrailingColumns) {
  Tensor x = Tensor::uninitialized(DType::kFloat32, {6, 3, 4});
  for (std::size_t i = 0; i < 72; ++i) x.data<float>()[i] = static_cast<float>(i) * 0.5f - 3;
  write_npy(dir_ / "x.npy", x);
  Tensor y = Tensor::uninitialized(DType::kInt64, {5});
  write_npy(dir_ / "y.npy", y);
  const nlohmann::json bad = {{"train", {{"x", "x.npy"}, {"y", "y.npy"}}}};
  EXPECT_NE(error_of([&] {
              parse_data_spec(JsonField(bad, "m.json"), dir_);
            }).find("sample arrays of different N"),
            std::string::npos);
  const nlohmann::json j = {{"train", {{"x", "x.npy"}}}, {"order", "sequential"}};
  const DataSpec spec = parse_data_spec(JsonField(j, "m.json"), dir_);
  const DataInput in{.tensor = "x", .name = "x", .dtype = DType::kFloat32, .shape = {4, 3, 4}};
  ShuffleCache cache;
  const SplitReader reader(spec.train);
  // Rows 1..2 of the batch of global rows 4..7 (units 4, 5, 0, 1), columns 1..2 of dim 1.
  const Tensor got =
      read_box(reader, train_order(spec, {in}), cache, in, 4, Box{{1, 1, 0}, {2, 2, 4}});
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t c = 0; c < 2; ++c)
      for (std::int64_t k = 0; k < 4; ++k) {
        const std::int64_t sample = (4 + 1 + r) % 6;
        EXPECT_EQ(got.data<float>()[static_cast<std::size_t>((r * 2 + c) * 4 + k)],
                  x.data<float>()[static_cast<std::size_t>(sample * 12 + (1 + c) * 4 + k)]);
      }
  const nlohmann::json rnd = {{"train", {{"x", "x.npy"}}}, {"order", "random"}};
  EXPECT_NE(error_of([&] {
              parse_data_spec(JsonField(rnd, "m.json"), dir_);
            }).find("\"random\" applies to token streams only"),
            std::string::npos);
}

}  // namespace
}  // namespace meshflow
