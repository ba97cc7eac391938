// Tensor storage.
#include "meshflow/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "meshflow/core/limits.h"

namespace meshflow {

void Tensor::FreeAligned::operator()(std::byte* p) const { std::free(p); }

Tensor::Tensor(DType dtype, Shape shape) : Tensor(dtype, std::move(shape), NoFill{}) {
  std::memset(data_.get(), 0, nbytes());
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  return Tensor(dtype, std::move(shape), NoFill{});
}

Tensor::Tensor(DType dtype, Shape shape, NoFill) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_, dtype_, "tensor shape");
  // Always allocate at least one aligned block so data pointers are never null.
  std::size_t bytes = nbytes();
  std::size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(static_cast<std::byte*>(p));
}

Tensor Tensor::clone() const {
  Tensor out = uninitialized(dtype_, shape_);
  std::memcpy(out.bytes(), bytes(), nbytes());
  return out;
}

void Tensor::check_dtype(DType requested) const {
  if (requested != dtype_) {
    fail(ErrorKind::kInvalidArgument, "tensor holds {} but was read as {}", to_string(dtype_),
         to_string(requested));
  }
}

}  // namespace meshflow
