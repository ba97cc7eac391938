#include "meshflow/ops/view.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "meshflow/core/error.h"
#include "meshflow/core/limits.h"
#include "meshflow/kernels/copy_rows.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {

bool is_view_family(OpType t) {
  return t == OpType::kReshape || t == OpType::kTranspose || t == OpType::kSlice ||
         t == OpType::kSliceGrad;
}

namespace {

std::int64_t product(const Shape& s, int begin, int end) {
  std::int64_t p = 1;
  for (int d = begin; d < end; ++d) p *= s[static_cast<std::size_t>(d)];
  return p;
}

Shape resolve_reshape(const Shape& from, DType dtype, const Shape& want) {
  const std::int64_t count = numel(from);
  int unknown = -1;
  Shape known = want;
  for (std::size_t d = 0; d < want.size(); ++d) {
    if (want[d] == -1 && unknown < 0) {
      unknown = static_cast<int>(d);
      known[d] = 1;
    } else if (want[d] < 0) {
      fail(ErrorKind::kInvalidArgument,
           "reshape: shape {} has {} (extents are >= 0, with at most one -1)", to_string(want),
           want[d]);
    }
  }
  const std::int64_t rest = checked_numel(known, dtype, "reshape shape");
  Shape to = want;
  if (unknown >= 0) {
    if (rest == 0 || count % rest != 0) {
      fail(ErrorKind::kShapeMismatch, "reshape: cannot reshape {} ({} elements) into {}",
           to_string(from), count, to_string(want));
    }
    to[static_cast<std::size_t>(unknown)] = count / rest;
  }
  if (numel(to) != count) {
    fail(ErrorKind::kShapeMismatch, "reshape: cannot reshape {} ({} elements) into {} ({})",
         to_string(from), count, to_string(want), numel(to));
  }
  return to;
}

// Resolves slice's NumPy range (negative from the end, clamped) against its operand (slice) or
// its result (slice_grad, whose `shape` is the sliced operand's).
Op normalize_slice(const Op& op, const std::vector<TensorSpec>& in) {
  const std::string_view name = to_string(op.type);
  const Shape& whole = op.type == OpType::kSlice ? in[0].shape : op.shape;
  const int rank = static_cast<int>(whole.size());
  if (op.dim < -rank || op.dim >= rank) {
    fail(ErrorKind::kInvalidArgument, "{}: dim {} is out of range for a {}-d operand", name, op.dim,
         rank);
  }
  Op out = op;
  out.dim = op.dim < 0 ? op.dim + rank : op.dim;
  const std::int64_t n = whole[static_cast<std::size_t>(out.dim)];
  auto resolve = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
  out.start = resolve(op.start);
  out.end = std::max(out.start, resolve(op.end));
  if (op.type == OpType::kSliceGrad) {
    Shape expect = whole;
    expect[static_cast<std::size_t>(out.dim)] = out.end - out.start;
    if (in[0].shape != expect) {
      fail(ErrorKind::kShapeMismatch,
           "slice_grad: operand {} is not a slice [{}, {}) of {} on dim {}", to_string(in[0].shape),
           out.start, out.end, to_string(whole), out.dim);
    }
  }
  return out;
}

// slice: copies the range out of each outer row; slice_grad: zeros with the rows copied in. The
// sliced dim is never sharded (view_labels), so a shard's range is the global one.
Tensor slice_kernel(const Op& op, const Tensor& x) {
  const bool forward = op.type == OpType::kSlice;
  Shape out_shape = x.shape();
  const auto d = static_cast<std::size_t>(op.dim);
  out_shape[d] = forward ? op.end - op.start : op.shape[d];
  Tensor y = forward ? Tensor::uninitialized(x.dtype(), out_shape) : Tensor(x.dtype(), out_shape);
  const Shape& whole = forward ? x.shape() : out_shape;
  const std::int64_t outer = product(whole, 0, op.dim);
  const std::int64_t inner = product(whole, op.dim + 1, static_cast<int>(whole.size())) *
                             static_cast<std::int64_t>(size_of(x.dtype()));
  const std::int64_t row = whole[d] * inner;
  const std::int64_t piece = (op.end - op.start) * inner;
  if (piece == 0) return y;
  const std::byte* src = x.bytes();
  std::byte* dst = y.bytes();
  for (std::int64_t o = 0; o < outer; ++o) {
    if (forward) {
      std::memcpy(dst + o * piece, src + o * row + op.start * inner,
                  static_cast<std::size_t>(piece));
    } else {
      std::memcpy(dst + o * row + op.start * inner, src + o * piece,
                  static_cast<std::size_t>(piece));
    }
  }
  return y;
}

std::vector<int> resolve_perm(const std::vector<int>& dims, std::size_t rank) {
  const int r = static_cast<int>(rank);
  std::vector<int> perm(rank);
  if (dims.empty()) {
    for (int d = 0; d < r; ++d) perm[static_cast<std::size_t>(d)] = r - 1 - d;
    return perm;
  }
  std::vector<char> seen(rank, 0);
  bool ok = dims.size() == rank;
  for (std::size_t i = 0; ok && i < dims.size(); ++i) {
    const int d = dims[i] < 0 ? dims[i] + r : dims[i];
    ok = d >= 0 && d < r && !seen[static_cast<std::size_t>(d)];
    if (ok) {
      seen[static_cast<std::size_t>(d)] = 1;
      perm[i] = d;
    }
  }
  if (!ok) {
    fail(ErrorKind::kInvalidArgument,
         "transpose: dims [{}] are not a permutation of the {} dims of the operand",
         fmt::join(dims, ","), rank);
  }
  return perm;
}

// out[i0, ..., ik] = in[...] with out dim j reading operand dim perm[j]: the result's rows along
// its next-to-last dim run as one loop over the operand's stride (kernels/copy_rows.h where the
// operand's last dim stays last, each row one contiguous run), the dims outside them as an
// odometer; the result's rows split over the device's threads.
template <typename T>
void transpose_into(const T* in, const Shape& in_shape, const std::vector<int>& perm, T* out) {
  const std::size_t rank = perm.size();
  const std::int64_t n = numel(in_shape);
  if (n == 0) return;
  if (rank == 0) {
    out[0] = in[0];
    return;
  }
  const std::vector<std::int64_t> in_strides = row_major_strides(in_shape);
  std::vector<std::int64_t> stride(rank), extent(rank);
  for (std::size_t j = 0; j < rank; ++j) {
    stride[j] = in_strides[static_cast<std::size_t>(perm[j])];
    extent[j] = in_shape[static_cast<std::size_t>(perm[j])];
  }
  const std::int64_t inner = extent[rank - 1], step = stride[rank - 1];
  // The dim the row loop runs along (the result's second to last; none for a vector).
  const std::size_t along = rank >= 2 ? rank - 2 : 0;
  const std::int64_t along_extent = rank >= 2 ? extent[along] : n / inner;
  const std::int64_t along_stride = rank >= 2 ? stride[along] : 0;
  parallel_for(n / inner, row_grain(inner), [&](std::int64_t first, std::int64_t last) {
    // The odometer at row `first`.
    std::vector<std::int64_t> index = row_start_index(extent, first);
    std::int64_t base = 0;
    for (std::size_t d = 0; d < rank; ++d) base += index[d] * stride[d];
    T* o = out + first * inner;
    for (std::int64_t row = first; row < last;) {
      const std::int64_t at = rank >= 2 ? index[along] : 0;
      const std::int64_t run = std::min(last - row, along_extent - at);
      const T* src = in + base;
      if (step == 1) {
        copy_rows(reinterpret_cast<const std::byte*>(src),
                  along_stride * static_cast<std::int64_t>(sizeof(T)),
                  reinterpret_cast<std::byte*>(o), run,
                  inner * static_cast<std::int64_t>(sizeof(T)));
        o += run * inner;
      } else {
        for (std::int64_t r = 0; r < run; ++r, src += along_stride, o += inner)
          for (std::int64_t i = 0; i < inner; ++i) o[i] = src[i * step];
      }
      row += run;
      if (rank < 2 || row == last) break;
      // The run ends its dim: back to its start, and carry into the dims outside it.
      base -= at * along_stride;
      index[along] = 0;
      for (std::size_t d = along; d-- > 0;) {
        base += stride[d];
        if (++index[d] < extent[d]) break;
        base -= stride[d] * extent[d];
        index[d] = 0;
      }
    }
  });
}

// The local result shape of a reshape of a shard of `local` shape (see view_kernel).
Shape local_reshape(const Shape& global_in, const Shape& global_out, const Shape& local) {
  Shape out = global_out;
  for (const DimGroup& g : reshape_groups(global_in, global_out)) {
    if (g.out_begin == g.out_end) continue;
    const std::int64_t held = product(local, g.in_begin, g.in_end);
    const std::int64_t rest = product(global_out, g.out_begin + 1, g.out_end);
    if (rest > 0) out[static_cast<std::size_t>(g.out_begin)] = held / rest;
  }
  return out;
}

}  // namespace

std::vector<DimGroup> reshape_groups(const Shape& from, const Shape& to) {
  const int nin = static_cast<int>(from.size()), nout = static_cast<int>(to.size());
  MESHFLOW_CHECK(numel(from) == numel(to), "reshape_groups {} -> {}", to_string(from),
                 to_string(to));
  if (numel(from) == 0) return {DimGroup{0, nin, 0, nout}};
  std::vector<DimGroup> groups;
  int i = 0, j = 0;
  while (i < nin || j < nout) {
    const bool in_one = i < nin && from[static_cast<std::size_t>(i)] == 1;
    const bool out_one = j < nout && to[static_cast<std::size_t>(j)] == 1;
    if (in_one && out_one) {
      groups.push_back({i, i + 1, j, j + 1});
      ++i, ++j;
    } else if (in_one || j == nout) {
      groups.push_back({i, i + 1, j, j});
      ++i;
    } else if (out_one || i == nin) {
      groups.push_back({i, i, j, j + 1});
      ++j;
    } else {
      DimGroup g{i, i, j, j};
      std::int64_t pi = from[static_cast<std::size_t>(i++)], po = to[static_cast<std::size_t>(j++)];
      while (pi != po) {
        if (pi < po) {
          MESHFLOW_CHECK(i < nin);
          pi *= from[static_cast<std::size_t>(i++)];
        } else {
          MESHFLOW_CHECK(j < nout);
          po *= to[static_cast<std::size_t>(j++)];
        }
      }
      g.in_end = i;
      g.out_end = j;
      groups.push_back(g);
    }
  }
  return groups;
}

Op normalize_view(const Op& op, const std::vector<TensorSpec>& in) {
  Op out = op;
  if (op.type == OpType::kSlice || op.type == OpType::kSliceGrad) return normalize_slice(op, in);
  if (op.type == OpType::kReshape) {
    out.shape = resolve_reshape(in[0].shape, in[0].dtype, op.shape);
  } else {
    out.dims = resolve_perm(op.dims, in[0].shape.size());
  }
  return out;
}

TensorSpec infer_view(const Op& raw, const std::vector<TensorSpec>& in) {
  const Op op = normalize_view(raw, in);
  if (op.type == OpType::kReshape || op.type == OpType::kSliceGrad) return {op.shape, in[0].dtype};
  if (op.type == OpType::kSlice) {
    Shape out = in[0].shape;
    out[static_cast<std::size_t>(op.dim)] = op.end - op.start;
    return {out, in[0].dtype};
  }
  Shape out;
  for (int d : op.dims) out.push_back(in[0].shape[static_cast<std::size_t>(d)]);
  return {out, in[0].dtype};
}

Tensor view_kernel(const Op& op, const std::vector<const Tensor*>& in,
                   const std::vector<TensorSpec>& globals) {
  const Tensor& x = *in[0];
  if (op.type == OpType::kSlice || op.type == OpType::kSliceGrad) return slice_kernel(op, x);
  if (op.type == OpType::kReshape) {
    Tensor y =
        Tensor::uninitialized(x.dtype(), local_reshape(globals[0].shape, op.shape, x.shape()));
    MESHFLOW_CHECK(y.numel() == x.numel(), "reshape of a {} shard to {}", to_string(x.shape()),
                   to_string(y.shape()));
    if (x.nbytes() > 0) std::memcpy(y.bytes(), x.bytes(), x.nbytes());
    return y;
  }
  Shape out;
  for (int d : op.dims) out.push_back(x.shape()[static_cast<std::size_t>(d)]);
  Tensor y = Tensor::uninitialized(x.dtype(), out);
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    transpose_into(x.data<T>().data(), x.shape(), op.dims, y.data<T>().data());
  });
  return y;
}

DimLabels view_labels(const Op& op, const std::vector<TensorSpec>& in, const Shape& out) {
  DimLabels l;
  l.terms = {0};  // linear: a Partial operand gives a Partial result
  const int rank = static_cast<int>(in[0].shape.size());
  if (op.type == OpType::kSlice || op.type == OpType::kSliceGrad) {
    // Every dim but the sliced one carries its label through; the sliced dim has one label on
    // each side (they index different ranges), neither shardable: a shard of it would need the
    // global offsets the range is cut at.
    l.inputs = {label_range(0, rank)};
    l.output = label_range(0, rank);
    l.output[static_cast<std::size_t>(op.dim)] = rank;
    l.unshardable = {op.dim, rank};
    return l;
  }
  if (op.type == OpType::kTranspose) {
    l.inputs = {label_range(0, rank)};
    l.output = op.dims;
    return l;
  }
  // One shardable label per group, on its outermost dim each side; the group's other dims get
  // labels no strategy shards (a shard there is not a row-major block of the group).
  l.inputs = {std::vector<int>(static_cast<std::size_t>(rank))};
  l.output.assign(out.size(), 0);
  int next = 0;
  for (const DimGroup& g : reshape_groups(in[0].shape, out)) {
    const int shared = next++;
    for (int d = g.in_begin; d < g.in_end; ++d) {
      const int label = d == g.in_begin && g.out_begin < g.out_end ? shared : next++;
      if (label != shared) l.unshardable.push_back(label);
      l.inputs[0][static_cast<std::size_t>(d)] = label;
    }
    for (int d = g.out_begin; d < g.out_end; ++d)
      l.output[static_cast<std::size_t>(d)] = d == g.out_begin ? shared : next++;
  }
  return l;
}

bool reshape_keeps_shards(const Layout& in, const Layout& out) {
  if (!(in.mesh == out.mesh) || in.placements.size() != out.placements.size()) return false;
  for (std::size_t m = 0; m < in.placements.size(); ++m) {
    if (in.placements[m].is_shard() != out.placements[m].is_shard()) return false;
    if (!in.placements[m].is_shard() && !(in.placements[m] == out.placements[m])) return false;
  }
  if (numel(in.shape) != numel(out.shape)) return false;
  const std::vector<DimGroup> groups = reshape_groups(in.shape, out.shape);
  // The flat range of a group a box covers: {start, length}, or nullopt when not contiguous
  // (dims after the first partial one must be whole, dims before it of extent 1).
  auto range = [](const Box& b, const Shape& shape, int begin,
                  int end) -> std::optional<std::pair<std::int64_t, std::int64_t>> {
    std::int64_t start = 0, length = 1;
    for (int d = begin; d < end; ++d) length *= b.extent[static_cast<std::size_t>(d)];
    if (length == 0) return std::pair<std::int64_t, std::int64_t>{0, 0};
    bool partial_seen = false;
    std::int64_t outer = 1;  // elements of the box in the dims before d
    for (int d = begin; d < end; ++d) {
      const auto k = static_cast<std::size_t>(d);
      const bool whole = b.extent[k] == shape[k];
      if (!whole && (partial_seen || outer > 1)) return std::nullopt;
      start = start * shape[k] + b.offset[k];
      outer *= b.extent[k];
      partial_seen = partial_seen || !whole;
    }
    return std::pair<std::int64_t, std::int64_t>{start, length};
  };
  for (DeviceId device : in.mesh.devices) {
    const Box a = shard_box(in, device), b = shard_box(out, device);
    for (const DimGroup& g : groups) {
      if (g.out_begin == g.out_end) continue;  // a dropped size-1 dim
      // view_kernel's shape: the result shard spans the group's inner result dims, and an empty
      // group keeps its outermost result dim whole.
      for (int d = g.out_begin + 1; d < g.out_end; ++d)
        if (b.extent[static_cast<std::size_t>(d)] != out.shape[static_cast<std::size_t>(d)])
          return false;
      if (product(out.shape, g.out_begin + 1, g.out_end) == 0 &&
          b.extent[static_cast<std::size_t>(g.out_begin)] !=
              out.shape[static_cast<std::size_t>(g.out_begin)])
        return false;
      if (g.in_begin == g.in_end) continue;  // an inserted size-1 dim
      const auto ra = range(a, in.shape, g.in_begin, g.in_end);
      const auto rb = range(b, out.shape, g.out_begin, g.out_end);
      if (!ra || !rb || *ra != *rb) return false;
    }
  }
  return true;
}

}  // namespace meshflow
