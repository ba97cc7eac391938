// Element types a tensor can hold, their sizes, names and NumPy descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshflow {

enum class DType { kFloat32, kFloat64, kInt32, kInt64 };

// Returns the size of one element of `dtype` in bytes.
std::size_t size_of(DType dtype);

// Returns "float32", "float64", "int32" or "int64".
std::string_view to_string(DType dtype);

// Returns the dtype named `name` (one of the names to_string gives); throws Error otherwise.
DType parse_dtype(std::string_view name);

// Returns the little-endian NumPy descriptor of `dtype`, e.g. "<f4".
std::string_view npy_descr(DType dtype);

// Returns true when `dtype` is a floating-point type.
bool is_floating(DType dtype);

// Returns the C++ element type's DType (float, double, int32_t, int64_t).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::kInt64;
}

// Calls fn(T{}) with T the C++ type of `dtype`, returning what fn returns.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt32:
      return fn(std::int32_t{});
    case DType::kInt64:
      break;
  }
  return fn(std::int64_t{});
}

}  // namespace meshflow
