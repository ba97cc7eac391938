// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) on x86-64.
#include "meshflow/kernels/float_mode.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define MESHFLOW_MXCSR 1
#endif

namespace meshflow {

#if MESHFLOW_MXCSR
namespace {
constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
}  // namespace

FlushDenormals::FlushDenormals() : saved_(_mm_getcsr()) {
  _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
}
FlushDenormals::~FlushDenormals() { _mm_setcsr(saved_); }
#else
FlushDenormals::FlushDenormals() = default;
FlushDenormals::~FlushDenormals() = default;
#endif

}  // namespace meshflow
