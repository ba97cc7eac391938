// Errors a user can cause (meshflow::Error, with a kind) and the always-on internal check macro.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace meshflow {

// What went wrong, for callers that react differently (the CLI maps every kind to exit code 1).
enum class ErrorKind { kInvalidArgument, kShapeMismatch, kIo, kCommunication, kTimeout, kInternal };

// Returns the lower-case name of `kind`, e.g. "invalid argument".
std::string_view to_string(ErrorKind kind);

// Returns the exit status of a meshflow process that stops on an error of `kind`:
//   1  bad input: a value, file or folder at fault, or mpi ranks that disagree
//   3  a runtime failure: a device that failed or timed out, a communication or internal error
// (0 is success and 2 a usage error of the command line.)
int exit_status(ErrorKind kind);

// Where an error was raised: on this device alone, or on every device of a job at once (after
// the devices agreed that they all fail, so one of them reports it for all).
enum class ErrorScope { kThisDevice, kEveryDevice };

// A failure the user can cause or act on. The message names the offending value.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, ErrorScope scope = ErrorScope::kThisDevice)
      : std::runtime_error(message), kind_(kind), scope_(scope) {}
  ErrorKind kind() const { return kind_; }
  ErrorScope scope() const { return scope_; }

 private:
  ErrorKind kind_;
  ErrorScope scope_;
};

// Throws Error(kind, fmt::format(format, args...)).
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

namespace detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& detail);
}  // namespace detail

}  // namespace meshflow

// Always-on internal invariant check (independent of NDEBUG). Throws Error(kInternal).
// The condition must have no side effects.
#define MESHFLOW_CHECK(cond, ...)                                                       \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::meshflow::detail::check_failed(#cond, __FILE__, __LINE__,                       \
                                       ::meshflow::detail::check_message(__VA_ARGS__)); \
    }                                                                                   \
  } while (false)

namespace meshflow::detail {
inline std::string check_message() { return {}; }
template <typename... Args>
std::string check_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace meshflow::detail
