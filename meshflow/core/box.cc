// Box arithmetic and the n-d region copy.
#include "meshflow/core/box.h"

#include <algorithm>

#include "meshflow/core/copy.h"
#include "meshflow/core/error.h"

namespace meshflow {

Box full_box(const Shape& shape) { return Box{std::vector<std::int64_t>(shape.size(), 0), shape}; }

std::int64_t numel(const Box& box) { return numel(box.extent); }

Box intersect(const Box& a, const Box& b) {
  MESHFLOW_CHECK(a.offset.size() == b.offset.size(), "boxes of rank {} and {}", a.offset.size(),
                 b.offset.size());
  Box out{a.offset, a.extent};
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    std::int64_t lo = std::max(a.offset[d], b.offset[d]);
    std::int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    out.offset[d] = lo;
    out.extent[d] = std::max<std::int64_t>(0, hi - lo);
  }
  return out;
}

bool contains(const Box& outer, const Box& inner) {
  if (outer.offset.size() != inner.offset.size()) return false;
  if (numel(inner) == 0) return true;
  for (std::size_t d = 0; d < outer.offset.size(); ++d) {
    if (inner.offset[d] < outer.offset[d]) return false;
    if (inner.offset[d] + inner.extent[d] > outer.offset[d] + outer.extent[d]) return false;
  }
  return true;
}

std::string to_string(const Box& box) {
  std::string out = "[";
  for (std::size_t d = 0; d < box.offset.size(); ++d) {
    if (d) out += ", ";
    out += fmt::format("{}:{}", box.offset[d], box.offset[d] + box.extent[d]);
  }
  return out + "]";
}

std::optional<std::int64_t> contiguous_offset(const Box& inner, const Box& outer) {
  if (numel(inner) == 0) return std::nullopt;
  const std::size_t rank = inner.extent.size();
  std::size_t j = 0;  // first dim where inner does not have extent 1
  while (j < rank && inner.extent[j] == 1) ++j;
  for (std::size_t k = j + 1; k < rank; ++k) {
    if (inner.extent[k] != outer.extent[k]) return std::nullopt;
  }
  std::int64_t flat = 0;
  const auto strides = row_major_strides(outer.extent);
  for (std::size_t k = 0; k < rank; ++k) flat += (inner.offset[k] - outer.offset[k]) * strides[k];
  return flat;
}

std::vector<Box> contiguous_runs(const Box& part, const std::vector<Box>& outers) {
  const std::size_t rank = part.extent.size();
  auto whole = [&](std::size_t d) {
    for (const Box& o : outers)
      if (part.extent[d] != o.extent[d]) return false;
    return true;
  };
  std::size_t c = rank == 0 ? 0 : rank - 1;
  while (c > 0 && whole(c)) --c;
  Box run = part;
  for (std::size_t d = 0; d < c; ++d) run.extent[d] = 1;
  std::vector<Box> runs;
  std::vector<std::int64_t> index(c, 0);
  while (true) {
    for (std::size_t d = 0; d < c; ++d) run.offset[d] = part.offset[d] + index[d];
    runs.push_back(run);
    std::size_t d = c;
    while (d > 0 && ++index[d - 1] == part.extent[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return runs;
}

void for_each_slab(const Shape& shape, std::int64_t max_elems,
                   const std::function<void(const Box&)>& fn) {
  const std::int64_t total = numel(shape);
  if (total == 0) return;
  const std::size_t rank = shape.size();
  if (rank == 0) return fn(Box{});
  max_elems = std::max<std::int64_t>(1, max_elems);
  // j: the outermost dim whose trailing dims (after j) fit in one slab.
  std::size_t j = rank - 1;
  std::int64_t trailing = 1;  // elements of one index of dim j
  while (j > 0 && trailing * shape[j] <= max_elems) {
    trailing *= shape[j];
    --j;
  }
  const std::int64_t step = std::max<std::int64_t>(1, max_elems / trailing);
  Box slab = full_box(shape);
  std::vector<std::int64_t> prefix(j, 0);  // the fixed index of each dim before j
  while (true) {
    for (std::size_t d = 0; d < j; ++d) {
      slab.offset[d] = prefix[d];
      slab.extent[d] = 1;
    }
    for (std::int64_t lo = 0; lo < shape[j]; lo += step) {
      slab.offset[j] = lo;
      slab.extent[j] = std::min(step, shape[j] - lo);
      fn(slab);
    }
    std::size_t d = j;
    while (d > 0) {
      --d;
      if (++prefix[d] < shape[d]) break;
      prefix[d] = 0;
      if (d == 0) return;
    }
    if (j == 0) return;
  }
}

void copy_box(ConstBuffer src, const std::vector<std::int64_t>& src_offset, MutableBuffer dst,
              const std::vector<std::int64_t>& dst_offset,
              const std::vector<std::int64_t>& extent) {
  const BoxCopy copy = prepare_box_copy(src, src_offset, dst, dst_offset, extent);
  run_box_copy(copy, 0, box_copy_rows(copy), Store::kCached);
}

void copy_box(const Tensor& src, const Box& src_box, Tensor& dst,
              const std::vector<std::int64_t>& dst_offset) {
  MESHFLOW_CHECK(src.dtype() == dst.dtype(), "copy_box from {} to {}", to_string(src.dtype()),
                 to_string(dst.dtype()));
  copy_box(ConstBuffer{src.bytes(), &src.shape(), size_of(src.dtype())}, src_box.offset,
           MutableBuffer{dst.bytes(), &dst.shape(), size_of(dst.dtype())}, dst_offset,
           src_box.extent);
}

Tensor slice(const Tensor& src, const Box& box) { return slice(view(src), box); }

Tensor slice(TensorView src, const Box& box) {
  Tensor out = Tensor::uninitialized(src.dtype, box.extent);  // copy_box writes every element
  const std::size_t elem = size_of(src.dtype);
  copy_box(ConstBuffer{src.data, &src.shape, elem}, box.offset,
           MutableBuffer{out.bytes(), &out.shape(), elem},
           std::vector<std::int64_t>(box.extent.size(), 0), box.extent);
  return out;
}

}  // namespace meshflow
