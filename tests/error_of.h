// What a gtest suite asks of a call expected to fail: its Error's one-line message.
#pragma once

#include <functional>
#include <string>

#include "meshflow/core/error.h"

namespace meshflow::testing {

// Returns the message of the Error `fn` throws, or "(no error)" when it returns.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace meshflow::testing
