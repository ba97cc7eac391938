// NumPy .npy files: read format versions 1.0-3.0, write 1.0 (2.0 when the header needs it).
// Little-endian, C order, dtypes float32/float64/int32/int64 only. Reads and writes go straight
// between the file and tensor memory (positioned I/O), so a file of any size needs no copy of
// itself in memory, and headers are read apart from the data so callers can stream.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "meshflow/core/file.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

// What a .npy header says: the element type, the shape and where the data starts.
struct NpyHeader {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::int64_t data_offset = 0;
  bool operator==(const NpyHeader&) const = default;
};

// The largest header meshflow reads (NumPy itself writes a few hundred bytes).
inline constexpr std::int64_t kMaxNpyHeaderBytes = 1 << 20;

// Returns the header at the start of `bytes`, the first bytes of a .npy file of `file_size`
// bytes (`bytes` must hold the whole header when the file does). Throws Error(kIo) naming
// `name` and the problem for bad magic, an unsupported version, a malformed header or trailing
// text after it, a big-endian, object or unsupported dtype, Fortran order, a shape over the
// size limits, or a data section that is truncated or has extra bytes.
NpyHeader parse_npy_header(std::string_view bytes, std::string_view name, std::int64_t file_size);

// Returns the header of the open .npy `file`, checked as parse_npy_header does.
NpyHeader read_npy_header(const File& file);

// A .npy header of an element type meshflow's DType may lack: its descr as written ('<u2'),
// the element's bytes, the shape and where the data starts.
struct NpyRawHeader {
  std::string descr;
  std::size_t item_bytes = 0;
  Shape shape;
  std::int64_t data_offset = 0;
  bool operator==(const NpyRawHeader&) const = default;
};

// Returns the header of the open .npy `file`, checked as read_npy_header does, taking any
// little-endian element type whose descr is in `accepted` (e.g. {"<u2", "<i4", "<i8"}).
NpyRawHeader read_npy_raw_header(const File& file, std::span<const std::string_view> accepted);

// Returns the header bytes (magic, version, length, padded dict) of an array of `dtype` and
// `shape`; the data that follows starts 64-byte aligned. `alignment` (a multiple of 64): the whole
// header's size, padded with spaces as NumPy pads it, is a multiple of it (4096: the data starts on
// a disk block, for unbuffered writes).
std::string encode_npy_header(DType dtype, const Shape& shape, std::size_t alignment = 64);

// As above, for element type `descr` as NumPy writes it ('<u2' for the uint16 token streams
// DType lacks).
std::string encode_npy_header(std::string_view descr, const Shape& shape,
                              std::size_t alignment = 64);

// Returns the array stored in `path`.
Tensor read_npy(const std::filesystem::path& path);

// Returns the array encoded by the .npy bytes `bytes` (`name` is used in error messages).
Tensor parse_npy(std::string_view bytes, std::string_view name);

// Returns the .npy encoding of `tensor`.
std::string encode_npy(const Tensor& tensor);

// Writes `tensor` to `path` by the atomic output protocol of file.h (a reader never sees a
// partial file). Throws Error(kIo) on failure.
void write_npy(const std::filesystem::path& path, const Tensor& tensor);

}  // namespace meshflow
