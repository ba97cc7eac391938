// NumPy .npy files: read format versions 1.0-3.0, write 1.0 (2.0 when the header needs it).
// Little-endian, C order, dtypes float32/float64/int32/int64 only.
#pragma once

#include <filesystem>

#include "meshflow/core/tensor.h"

namespace meshflow {

// Returns the array stored in `path`. Throws Error(kIo) naming the file and the problem for a
// missing file, bad magic, unsupported version, malformed header, big-endian or object or
// unsupported dtype, Fortran order, or a data section that is truncated or has extra bytes.
Tensor read_npy(const std::filesystem::path& path);

// Returns the array encoded by the .npy bytes `bytes` (`name` is used in error messages).
Tensor parse_npy(std::string_view bytes, std::string_view name);

// Returns the .npy encoding of `tensor`.
std::string encode_npy(const Tensor& tensor);

// Writes `tensor` to `path` through a temporary file renamed into place, so a reader never sees
// a partial file. Throws Error(kIo) on failure.
void write_npy(const std::filesystem::path& path, const Tensor& tensor);

// Writes `contents` to `path` through a temporary file renamed into place.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Returns the contents of `path`; throws Error(kIo) naming it when it cannot be read.
std::string read_file(const std::filesystem::path& path);

}  // namespace meshflow
