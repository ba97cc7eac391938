// Box: an axis-aligned region of a tensor (offset and extent per dim), and copy_box, the n-d
// region copy every data movement in meshflow reduces to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/core/shape.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

// The region [offset, offset + extent) in each dim. Invariant: offset.size() == extent.size(),
// extents are non-negative.
struct Box {
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> extent;

  bool operator==(const Box&) const = default;
};

// Returns the box covering all of `shape`.
Box full_box(const Shape& shape);

// Returns the number of elements in `box`.
std::int64_t numel(const Box& box);

// Returns the intersection of `a` and `b` (same rank); extents are 0 where they do not meet.
Box intersect(const Box& a, const Box& b);

// Returns true when `inner` lies within `outer` (an empty box lies within any box of its rank).
bool contains(const Box& outer, const Box& inner);

// Returns the flat element offset of `inner` within a row-major tensor that holds exactly the
// region `outer`, when `inner` (inside `outer`) is one contiguous run there; nullopt when it is
// not, or is empty.
std::optional<std::int64_t> contiguous_offset(const Box& inner, const Box& outer);

// Returns `part` (inside every box of `outers`, same rank) cut into the fewest runs that are
// each contiguous in row-major storage of every one of `outers`, in row-major order: the runs
// span `part`'s extent on the dims from some dim c on (those after c are whole in every outer
// box) and fix one index on each dim before c. A scalar or empty-rank part is one run.
std::vector<Box> contiguous_runs(const Box& part, const std::vector<Box>& outers);

// Calls fn(slab) for boxes that tile `shape` in row-major storage order, each one contiguous run
// of the tensor's storage holding at most max(max_elems, one element) elements... unless a
// single innermost row alone is larger, in which case that row is cut too. Each slab fixes one
// index in the dims before some dim j, takes a range of dim j and spans every dim after j.
void for_each_slab(const Shape& shape, std::int64_t max_elems,
                   const std::function<void(const Box&)>& fn);

// Returns "[o0:o0+e0, o1:o1+e1]" (NumPy slice notation).
std::string to_string(const Box& box);

// A strided view for copy_box: a base pointer, the full shape the pointer spans (row-major) and
// the element size. Lets copy_box move data between tensors and raw communication buffers.
struct ConstBuffer {
  const std::byte* data;
  const Shape* shape;
  std::size_t elem_size;
};
struct MutableBuffer {
  std::byte* data;
  const Shape* shape;
  std::size_t elem_size;
};

// Copies the region `extent` starting at `src_offset` in `src` to `dst_offset` in `dst`.
// Preconditions (checked): ranks agree, both regions lie within their shapes, equal elem sizes.
// Trailing dims that both regions span fully are merged, so each contiguous run is one memcpy.
void copy_box(ConstBuffer src, const std::vector<std::int64_t>& src_offset, MutableBuffer dst,
              const std::vector<std::int64_t>& dst_offset, const std::vector<std::int64_t>& extent);

// Copies box `src_box` of `src` into `dst` at `dst_offset`. Same dtype required.
void copy_box(const Tensor& src, const Box& src_box, Tensor& dst,
              const std::vector<std::int64_t>& dst_offset);

// Returns a new tensor holding box `box` of `src`.
Tensor slice(const Tensor& src, const Box& box);
Tensor slice(TensorView src, const Box& box);

}  // namespace meshflow
