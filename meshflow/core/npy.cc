// .npy encoding and decoding. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// parsed here by a small recursive-descent reader that accepts exactly the keys NumPy writes.
#include "meshflow/core/npy.h"

#include <cstring>
#include <limits>
#include <optional>

#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"

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
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) bad(fmt::format("unexpected text after the dict at byte {}", pos_));
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

namespace {

// Returns the element bytes of a plain little-endian numeric descr ('<u2', '|u1', '<f8'), 0 for
// any other.
std::size_t descr_item_bytes(std::string_view descr) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) return 0;
  if (descr[1] != 'u' && descr[1] != 'i' && descr[1] != 'f') return 0;
  const std::string_view digits = descr.substr(2);
  if (digits != "1" && digits != "2" && digits != "4" && digits != "8") return 0;
  return static_cast<std::size_t>(digits[0] - '0');
}

// Returns the raw header at the start of `bytes`; `item_bytes(descr, shape)` gives a descr's
// element bytes, or throws naming the file when it takes no such descr or the array is larger
// than meshflow reads.
template <typename ItemBytes>
NpyRawHeader parse_raw_header(std::string_view bytes, std::string_view name, std::int64_t file_size,
                              ItemBytes item_bytes) {
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
  const std::int64_t header_len = read_le(bytes, 8, len_width);
  if (header_len > kMaxNpyHeaderBytes) {
    fail(ErrorKind::kIo, "{}: .npy header of {} bytes is longer than the {} meshflow reads", name,
         header_len, kMaxNpyHeaderBytes);
  }
  const std::int64_t data_start = static_cast<std::int64_t>(8 + len_width) + header_len;
  if (static_cast<std::int64_t>(bytes.size()) < data_start)
    fail(ErrorKind::kIo, "{}: truncated .npy header", name);
  std::string_view header = bytes.substr(8 + len_width, static_cast<std::size_t>(header_len));
  while (!header.empty() && (header.back() == '\n' || header.back() == ' '))
    header.remove_suffix(1);

  auto h = HeaderParser(header, name).parse();
  if (h.fortran_order) {
    fail(ErrorKind::kIo, "{}: Fortran-order arrays are not supported (save with C order)", name);
  }
  const std::size_t item = item_bytes(h.descr, h.shape);
  std::int64_t count = 1;
  for (std::int64_t d : h.shape) count *= d;
  const std::int64_t expected = count * static_cast<std::int64_t>(item);
  const std::int64_t actual = file_size - data_start;
  if (actual < expected) {
    fail(ErrorKind::kIo, "{}: truncated data: shape {} of '{}' needs {} bytes, file has {}", name,
         to_string(h.shape), h.descr, expected, actual);
  }
  if (actual > expected) {
    fail(ErrorKind::kIo, "{}: {} unexpected bytes after the data of shape {} of '{}'", name,
         actual - expected, to_string(h.shape), h.descr);
  }
  return NpyRawHeader{h.descr, item, h.shape, data_start};
}

// Returns the first bytes of `file`: its whole header where it has one.
std::string header_bytes(const File& file) {
  const std::int64_t size = file.size();
  // The fixed prefix says how long the header is; read exactly that much.
  std::string prefix(static_cast<std::size_t>(std::min<std::int64_t>(size, 12)), '\0');
  file.read_at(0, std::as_writable_bytes(std::span<char>(prefix.data(), prefix.size())));
  std::int64_t header_end = static_cast<std::int64_t>(prefix.size());
  if (prefix.size() >= 10 && std::string_view(prefix).substr(0, 6) == kMagic) {
    const std::size_t len_width = prefix[6] == 1 ? 2 : 4;
    if (prefix.size() >= 8 + len_width) {
      header_end = std::min<std::int64_t>(
          size, static_cast<std::int64_t>(8 + len_width) +
                    std::min<std::int64_t>(read_le(prefix, 8, len_width), kMaxNpyHeaderBytes + 1));
    }
  }
  std::string header(static_cast<std::size_t>(header_end), '\0');
  file.read_at(0, std::as_writable_bytes(std::span<char>(header.data(), header.size())));
  return header;
}

}  // namespace

NpyHeader parse_npy_header(std::string_view bytes, std::string_view name, std::int64_t file_size) {
  DType dtype = DType::kFloat32;
  const NpyRawHeader raw =
      parse_raw_header(bytes, name, file_size, [&](const std::string& d, const Shape& shape) {
        dtype = dtype_from_descr(d, name);
        try {
          checked_numel(shape, dtype, "array of shape");
        } catch (const Error& e) {
          fail(ErrorKind::kIo, "{}: {}", name, e.what());
        }
        return size_of(dtype);
      });
  return NpyHeader{dtype, raw.shape, raw.data_offset};
}

NpyRawHeader read_npy_raw_header(const File& file, std::span<const std::string_view> accepted) {
  const std::string name = file.path().string();
  return parse_raw_header(
      header_bytes(file), name, file.size(), [&](const std::string& d, const Shape& shape) {
        for (std::string_view a : accepted) {
          const std::size_t item = descr_item_bytes(d);
          if (d != a || item == 0) continue;
          std::int64_t bytes = static_cast<std::int64_t>(item);
          for (std::int64_t n : shape) {
            if (n != 0 && bytes > kMaxTensorBytes / n)
              fail(ErrorKind::kIo, "{}: array of shape {} is larger than meshflow reads", name,
                   to_string(shape));
            bytes *= n;
          }
          return item;
        }
        if (!d.empty() && d[0] == '>') {
          fail(ErrorKind::kIo, "{}: big-endian arrays are not supported (descr '{}')", name, d);
        }
        fail(ErrorKind::kIo, "{}: unsupported dtype descr '{}' (expected {})", name, d,
             fmt::join(accepted, ", "));
      });
}

NpyHeader read_npy_header(const File& file) {
  return parse_npy_header(header_bytes(file), file.path().string(), file.size());
}

Tensor parse_npy(std::string_view bytes, std::string_view name) {
  const NpyHeader h = parse_npy_header(bytes, name, static_cast<std::int64_t>(bytes.size()));
  Tensor t = Tensor::uninitialized(h.dtype, h.shape);
  if (t.nbytes() > 0) std::memcpy(t.bytes(), bytes.data() + h.data_offset, t.nbytes());
  return t;
}

Tensor read_npy(const std::filesystem::path& path) {
  const File file = File::open_read(path);
  const NpyHeader h = read_npy_header(file);
  Tensor t = Tensor::uninitialized(h.dtype, h.shape);
  file.read_at(h.data_offset, std::span<std::byte>(t.bytes(), t.nbytes()));
  return t;
}

std::string encode_npy_header(DType dtype, const Shape& dims, std::size_t alignment) {
  return encode_npy_header(npy_descr(dtype), dims, alignment);
}

std::string encode_npy_header(std::string_view descr, const Shape& dims, std::size_t alignment) {
  MESHFLOW_CHECK(alignment >= kHeaderAlignment && alignment % kHeaderAlignment == 0,
                 "npy header alignment {}", alignment);
  std::string shape = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    shape += std::to_string(dims[i]);
    shape += (dims.size() == 1 || i + 1 < dims.size()) ? ", " : "";
  }
  if (dims.size() == 1) shape.pop_back();  // "(3,)" as NumPy writes it
  shape += ")";
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  int major = 1;
  std::size_t prefix = 10;
  std::size_t total = (prefix + dict.size() + 1 + alignment - 1) / alignment * alignment;
  if (total - prefix > 0xFFFF) {
    major = 2;
    prefix = 12;
    total = (prefix + dict.size() + 1 + alignment - 1) / alignment * alignment;
  }
  const std::size_t header_len = total - prefix;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';
  std::string out;
  out += kMagic;
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i)
    out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  return out + dict;
}

std::string encode_npy(const Tensor& tensor) {
  std::string out = encode_npy_header(tensor.dtype(), tensor.shape());
  out.append(reinterpret_cast<const char*>(tensor.bytes()), tensor.nbytes());
  return out;
}

void write_npy(const std::filesystem::path& path, const Tensor& tensor) {
  const std::filesystem::path target = output_target(path);
  const std::filesystem::path staged = staging_path(target);
  try {
    const File file = File::create(staged);
    const std::string header = encode_npy_header(tensor.dtype(), tensor.shape());
    file.write_at(0, std::as_bytes(std::span<const char>(header.data(), header.size())));
    file.write_at(static_cast<std::int64_t>(header.size()),
                  std::span<const std::byte>(tensor.bytes(), tensor.nbytes()));
  } catch (...) {
    discard(staged);
    throw;
  }
  publish(staged, target);
}

}  // namespace meshflow
