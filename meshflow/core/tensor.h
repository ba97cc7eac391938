// Tensor: an owning, contiguous, row-major host buffer of one dtype, 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "meshflow/core/dtype.h"
#include "meshflow/core/error.h"
#include "meshflow/core/shape.h"

namespace meshflow {

// Alignment of every Tensor's storage, in bytes (one cache line; enough for any SIMD load).
inline constexpr std::size_t kTensorAlignment = 64;

// Owns numel(shape) elements of `dtype`, zero-initialised, row-major, 64-byte aligned. Move-only:
// copies are explicit (clone) because tensors can be large.
class Tensor {
 public:
  Tensor() : Tensor(DType::kFloat32, Shape{0}) {}
  Tensor(DType dtype, Shape shape);
  // Returns a tensor whose elements are unspecified, for buffers every element of which is
  // about to be written (saves a pass over memory).
  static Tensor uninitialized(DType dtype, Shape shape);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * size_of(dtype_); }

  std::byte* bytes() { return data_.get(); }
  const std::byte* bytes() const { return data_.get(); }

  // Returns the elements as T; throws Error when T is not this tensor's dtype.
  template <typename T>
  std::span<T> data() {
    check_dtype(dtype_of<T>());
    return {reinterpret_cast<T*>(data_.get()), static_cast<std::size_t>(numel_)};
  }
  template <typename T>
  std::span<const T> data() const {
    check_dtype(dtype_of<T>());
    return {reinterpret_cast<const T*>(data_.get()), static_cast<std::size_t>(numel_)};
  }

  // Returns a deep copy.
  Tensor clone() const;

  // Returns t's storage under `shape` (as many elements): a reshape that copies nothing. `t` is
  // left empty (Tensor()). Throws Error when the element counts differ.
  static Tensor reshaped(Tensor&& t, Shape shape);

 private:
  // Frees storage of `bytes` (rounded) bytes, or keeps large buffers for reuse by the next
  // tensor of the same size, whichever thread makes it (tensor.cc says why).
  struct FreeAligned {
    std::size_t bytes;  // no initialiser: one would make it not default-constructible here
    void operator()(std::byte* p) const;
  };
  struct NoFill {};
  Tensor(DType dtype, Shape shape, NoFill);
  void check_dtype(DType requested) const;

  DType dtype_;
  Shape shape_;
  std::int64_t numel_;
  std::unique_ptr<std::byte[], FreeAligned> data_;
};

// Read-only row-major elements owned elsewhere (a Tensor, a NumPy array's memory): what a
// function that only reads a whole tensor may take, so that callers need not copy into a Tensor.
struct TensorView {
  DType dtype;
  Shape shape;
  const std::byte* data;
};

inline TensorView view(const Tensor& t) { return {t.dtype(), t.shape(), t.bytes()}; }

}  // namespace meshflow
