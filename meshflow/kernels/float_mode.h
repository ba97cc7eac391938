// The floating-point mode kernels run in: denormal (subnormal) floats flushed to zero, as
// TensorFlow's CPU runtime runs by default and torch.set_flush_denormal(True) asks. A denormal
// operand slows a product or an elementwise step 10-100x on x86 and weighs below 1.2e-38; the
// backward pass makes them (a gradient through a saturated softmax or GELU).
#pragma once

namespace meshflow {

// Sets flush-to-zero and denormals-are-zero on the calling thread for the guard's lifetime,
// restoring the thread's earlier mode after (x86-64; elsewhere a no-op).
class FlushDenormals {
 public:
  FlushDenormals();
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

// The calling thread's floating-point mode (x86-64's MXCSR; elsewhere 0), to run a kernel's
// parts on other threads in the mode of the thread that started it (kernels/parallel.h).
unsigned float_mode();
void set_float_mode(unsigned mode);

}  // namespace meshflow
