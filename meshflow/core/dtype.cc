// DType names, sizes and NumPy descriptors.
#include "meshflow/core/dtype.h"

#include "meshflow/core/error.h"

namespace meshflow {

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    if (to_string(d) == name) return d;
  }
  fail(ErrorKind::kInvalidArgument,
       "unknown dtype \"{}\" (expected float32, float64, int32 or int64)", name);
}

std::string_view npy_descr(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
  }
  return "";
}

bool is_floating(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }

}  // namespace meshflow
