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
unsigned float_mode() { return _mm_getcsr(); }
void set_float_mode(unsigned mode) { _mm_setcsr(mode); }
#else
FlushDenormals::FlushDenormals() = default;
FlushDenormals::~FlushDenormals() = default;
unsigned float_mode() { return 0; }
void set_float_mode(unsigned) {}
#endif

}  // namespace meshflow
