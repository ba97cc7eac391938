// The one clock for timing work inside meshflow (traces, profiles): seconds on the steady clock.
#pragma once

#include <time.h>

#include <chrono>

namespace meshflow {

// Returns seconds on the steady clock (an arbitrary origin: compare two readings).
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Returns the CPU seconds the calling thread has run (an arbitrary origin: compare two readings
// on one thread). Beside steady_seconds it tells work from waiting for a core.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace meshflow
