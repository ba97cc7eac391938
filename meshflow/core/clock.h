// The one clock for timing work inside meshflow (traces, profiles): seconds on the steady clock.
#pragma once

#include <chrono>

namespace meshflow {

// Returns seconds on the steady clock (an arbitrary origin: compare two readings).
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace meshflow
