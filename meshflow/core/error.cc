// Error kinds and the failure path of MESHFLOW_CHECK.
#include "meshflow/core/error.h"

namespace meshflow {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kShapeMismatch:
      return "shape mismatch";
    case ErrorKind::kIo:
      return "i/o";
    case ErrorKind::kCommunication:
      return "communication";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kInternal:
      return "internal";
  }
  return "unknown";
}

int exit_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kCommunication:
    case ErrorKind::kTimeout:
    case ErrorKind::kInternal:
      return 3;
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kShapeMismatch:
    case ErrorKind::kIo:
      break;
  }
  return 1;
}

namespace detail {
void check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  std::string message = fmt::format("internal check failed: {} at {}:{}", condition, file, line);
  if (!detail.empty()) message += ": " + detail;
  throw Error(ErrorKind::kInternal, message);
}
}  // namespace detail

}  // namespace meshflow
