// .npy encoding and decoding. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// parsed here by a small recursive-descent reader that accepts exactly the keys NumPy writes.
#include "meshflow/core/npy.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "meshflow/core/error.h"

namespace meshflow {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// NumPy pads headers so the data starts at a multiple of this many bytes.
constexpr std::size_t kHeaderAlignment = 64;

// Reads the header dict; every error names the file.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : text_(text), name_(name) {}

  struct Header {
    std::string descr;
    bool fortran_order = false;
    Shape shape;
  };

  Header parse() {
    Header h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        h.descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        h.shape = parse_tuple();
        have_shape = true;
      } else {
        bad(fmt::format("unexpected key '{}'", key));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') bad("expected ',' or '}'");
    }
    if (!have_descr || !have_order || !have_shape) {
      bad("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) {
    fail(ErrorKind::kIo, "{}: malformed .npy header: {}", name_, what);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) bad(fmt::format("expected '{}' at byte {}", c, pos_));
    ++pos_;
  }
  std::string parse_string() {
    char quote = peek();
    if (quote != '\'' && quote != '"') bad(fmt::format("expected a string at byte {}", pos_));
    std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string out(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("fortran_order is neither True nor False");
  }
  Shape parse_tuple() {
    expect('(');
    Shape shape;
    while (peek() != ')') {
      skip_space();
      std::int64_t value = 0;
      std::size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (value > (std::numeric_limits<std::int64_t>::max() - 9) / 10) bad("shape overflows");
        value = value * 10 + (text_[pos_] - '0');
        ++pos_;
      }
      if (pos_ == start)
        bad(fmt::format("expected a non-negative integer in shape at byte {}", pos_));
      // NumPy 1.x may write long literals such as 3L.
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
      shape.push_back(value);
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        bad("expected ',' or ')' in shape");
      }
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  std::string_view name_;
  std::size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& descr, std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    if (descr == npy_descr(d)) return d;
  }
  if (!descr.empty() && descr[0] == '>') {
    fail(ErrorKind::kIo, "{}: big-endian arrays are not supported (descr '{}')", name, descr);
  }
  if (descr.find('O') != std::string::npos) {
    fail(ErrorKind::kIo, "{}: object arrays are not supported (descr '{}')", name, descr);
  }
  fail(ErrorKind::kIo, "{}: unsupported dtype descr '{}' (expected <f4, <f8, <i4 or <i8)", name,
       descr);
}

std::uint32_t read_le(std::string_view bytes, std::size_t at, std::size_t width) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < width; ++i) {
    v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  }
  return v;
}

}  // namespace

Tensor parse_npy(std::string_view bytes, std::string_view name) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    fail(ErrorKind::kIo, "{}: not a .npy file (bad magic)", name);
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(ErrorKind::kIo, "{}: unsupported .npy format version {}.{} (expected 1.0, 2.0 or 3.0)",
         name, major, minor);
  }
  const std::size_t len_width = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_width) fail(ErrorKind::kIo, "{}: truncated .npy header", name);
  const std::size_t header_len = read_le(bytes, 8, len_width);
  const std::size_t data_start = 8 + len_width + header_len;
  if (bytes.size() < data_start) fail(ErrorKind::kIo, "{}: truncated .npy header", name);
  std::string_view header = bytes.substr(8 + len_width, header_len);
  while (!header.empty() && (header.back() == '\n' || header.back() == ' '))
    header.remove_suffix(1);

  auto h = HeaderParser(header, name).parse();
  if (h.fortran_order) {
    fail(ErrorKind::kIo, "{}: Fortran-order arrays are not supported (save with C order)", name);
  }
  DType dtype = dtype_from_descr(h.descr, name);
  // Guard the element count against overflow before allocating.
  std::uint64_t count = 1;
  for (std::int64_t e : h.shape) {
    if (e != 0 &&
        count > std::numeric_limits<std::uint64_t>::max() / 16 / static_cast<std::uint64_t>(e)) {
      fail(ErrorKind::kIo, "{}: shape {} is too large", name, to_string(h.shape));
    }
    count *= static_cast<std::uint64_t>(e);
  }
  const std::uint64_t expected = count * size_of(dtype);
  const std::uint64_t actual = bytes.size() - data_start;
  if (actual < expected) {
    fail(ErrorKind::kIo, "{}: truncated data: shape {} of {} needs {} bytes, file has {}", name,
         to_string(h.shape), to_string(dtype), expected, actual);
  }
  if (actual > expected) {
    fail(ErrorKind::kIo, "{}: {} unexpected bytes after the data of shape {} of {}", name,
         actual - expected, to_string(h.shape), to_string(dtype));
  }
  Tensor t(dtype, h.shape);
  if (expected > 0) std::memcpy(t.bytes(), bytes.data() + data_start, expected);
  return t;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot open \"{}\": {}", path.string(), std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(ErrorKind::kIo, "cannot read \"{}\"", path.string());
  return std::move(buffer).str();
}

Tensor read_npy(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) {
    fail(ErrorKind::kIo, "\"{}\" is a directory, not a .npy file", path.string());
  }
  return parse_npy(read_file(path), path.string());
}

std::string encode_npy(const Tensor& tensor) {
  std::string shape = "(";
  for (std::size_t i = 0; i < tensor.shape().size(); ++i) {
    shape += std::to_string(tensor.shape()[i]);
    shape += (tensor.shape().size() == 1 || i + 1 < tensor.shape().size()) ? ", " : "";
  }
  if (tensor.shape().size() == 1) shape.pop_back();  // "(3,)" as NumPy writes it
  shape += ")";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 npy_descr(tensor.dtype()), shape);
  int major = 1;
  std::size_t prefix = 10;
  std::size_t total =
      (prefix + dict.size() + 1 + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  if (total - prefix > 0xFFFF) {
    major = 2;
    prefix = 12;
    total = (prefix + dict.size() + 1 + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  }
  const std::size_t header_len = total - prefix;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';
  std::string out;
  out.reserve(total + tensor.nbytes());
  out += kMagic;
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  out += dict;
  out.append(reinterpret_cast<const char*>(tensor.bytes()), tensor.nbytes());
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "cannot write \"{}\": {}", path.string(), std::strerror(errno));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      fail(ErrorKind::kIo, "cannot write \"{}\"", path.string());
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::kIo, "cannot rename into \"{}\": {}", path.string(), ec.message());
  }
}

void write_npy(const std::filesystem::path& path, const Tensor& tensor) {
  write_file_atomic(path, encode_npy(tensor));
}

}  // namespace meshflow
