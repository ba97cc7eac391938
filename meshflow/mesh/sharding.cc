// shard_tensor and assemble.
#include "meshflow/mesh/sharding.h"

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"

namespace meshflow {

std::vector<Tensor> shard_tensor(const Tensor& global, const Layout& layout) {
  if (global.shape() != layout.shape || global.dtype() != layout.dtype) {
    fail(ErrorKind::kShapeMismatch, "tensor of shape {} {} does not match layout {}",
         to_string(global.shape()), to_string(global.dtype()), to_string(layout));
  }
  for (const Placement& p : layout.placements) {
    if (p.is_partial()) {
      fail(ErrorKind::kInvalidArgument,
           "cannot shard a full tensor onto placement \"{}\": use S(d) or R, then redistribute",
           to_string(p));
    }
  }
  std::vector<Tensor> shards;
  shards.reserve(layout.mesh.devices.size());
  for (DeviceId d : layout.mesh.devices) shards.push_back(slice(global, shard_box(layout, d)));
  return shards;
}

std::optional<FlatReduction> flat_reduction(const std::vector<ReduceOp>& ops,
                                            const std::vector<std::int64_t>& sizes) {
  MESHFLOW_CHECK(ops.size() == sizes.size());
  bool all_sum_avg = true, all_same = true;
  std::int64_t avg_divisor = 1;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    all_sum_avg = all_sum_avg && (ops[i] == ReduceOp::kSum || ops[i] == ReduceOp::kAvg);
    all_same = all_same && ops[i] == ops[0];
    if (ops[i] == ReduceOp::kAvg) avg_divisor *= sizes[i];
  }
  if (all_sum_avg) return FlatReduction{ReduceOp::kSum, avg_divisor};
  if (all_same) return FlatReduction{ops[0], 1};
  return std::nullopt;
}

void reduce_partial_terms(const std::vector<ReduceOp>& ops, const std::vector<std::int64_t>& sizes,
                          DType dtype, const std::vector<const std::byte*>& terms, std::byte* out,
                          std::int64_t n) {
  MESHFLOW_CHECK(!terms.empty());
  if (auto flat = flat_reduction(ops, sizes)) {
    reduce_terms(flat->op, dtype, terms, out, n);
    divide_by(dtype, out, n, flat->divisor);
    return;
  }
  // Mixed ops: value = op_0(op_1(...)): reduce each block of terms sharing the outer
  // coordinates over the innermost dim, then recurse on the outer dims.
  const std::int64_t inner = sizes.back();
  const std::size_t es = size_of(dtype);
  std::vector<std::vector<std::byte>> partial(
      terms.size() / inner, std::vector<std::byte>(static_cast<std::size_t>(n) * es + 1));
  std::vector<const std::byte*> next;
  for (std::size_t g = 0; g < partial.size(); ++g) {
    std::vector<const std::byte*> block(terms.begin() + g * inner, terms.begin() + (g + 1) * inner);
    reduce_partial_terms({ops.back()}, {inner}, dtype, block, partial[g].data(), n);
    next.push_back(partial[g].data());
  }
  reduce_partial_terms(std::vector<ReduceOp>(ops.begin(), ops.end() - 1),
                       std::vector<std::int64_t>(sizes.begin(), sizes.end() - 1), dtype, next, out,
                       n);
}

namespace {

// Returns the full value of the Partial group containing `device` (whose Partial coordinates
// are 0), reduced as assemble() documents.
Tensor reduce_partial(const Layout& layout, const std::vector<Tensor>& shards, DeviceId device) {
  const DeviceMesh& mesh = layout.mesh;
  const std::vector<MeshDim> pdims = partial_dims(layout);
  const Tensor& mine = shards[*find_device(mesh, device)];
  if (pdims.empty()) return mine.clone();
  std::vector<ReduceOp> ops;
  std::vector<std::int64_t> sizes;
  for (MeshDim m : pdims) {
    ops.push_back(layout.placements[m].op);
    sizes.push_back(mesh.shape[m]);
  }
  std::vector<const std::byte*> terms;
  for (DeviceId d : group_along(mesh, device, pdims))
    terms.push_back(shards[*find_device(mesh, d)].bytes());
  Tensor out(mine.dtype(), mine.shape());
  reduce_partial_terms(ops, sizes, out.dtype(), terms, out.bytes(), out.numel());
  return out;
}

}  // namespace

Tensor assemble(const Layout& layout, const std::vector<Tensor>& shards) {
  const DeviceMesh& mesh = layout.mesh;
  if (shards.size() != mesh.devices.size()) {
    fail(ErrorKind::kShapeMismatch, "mesh {} has {} devices but {} shards were given",
         to_string(mesh), mesh.devices.size(), shards.size());
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const DeviceId d = mesh.devices[i];
    const Box box = shard_box(layout, d);
    if (shards[i].dtype() != layout.dtype) {
      fail(ErrorKind::kShapeMismatch, "shard of device {} (rank{}) is {} but the layout says {}", d,
           i, to_string(shards[i].dtype()), to_string(layout.dtype));
    }
    if (shards[i].shape() != box.extent) {
      fail(ErrorKind::kShapeMismatch,
           "shard of device {} (rank{}) has shape {} but the layout gives it box {} of shape {}", d,
           i, to_string(shards[i].shape()), to_string(box), to_string(box.extent));
    }
  }
  const std::vector<MeshDim> pdims = partial_dims(layout);
  std::vector<MeshDim> rdims;
  for (std::size_t m = 0; m < layout.placements.size(); ++m) {
    if (layout.placements[m].is_replicate()) rdims.push_back(static_cast<MeshDim>(m));
  }
  const bool tolerant = !pdims.empty() && is_floating(layout.dtype);
  const double rtol = layout.dtype == DType::kFloat32 ? 1e-4 : 1e-10;

  Tensor global(layout.dtype, layout.shape);
  for (DeviceId d : mesh.devices) {
    const std::vector<std::int64_t> coords = coordinates(mesh, d);
    bool representative = true;
    for (MeshDim m : pdims) representative = representative && coords[m] == 0;
    for (MeshDim m : rdims) representative = representative && coords[m] == 0;
    if (!representative) continue;
    const Box box = shard_box(layout, d);
    Tensor value = reduce_partial(layout, shards, d);
    // Every replica (other coordinates on Replicate dims) must hold the same value.
    for (DeviceId other : group_along(mesh, d, rdims)) {
      if (other == d) continue;
      Tensor replica = reduce_partial(layout, shards, other);
      auto diff =
          tolerant ? compare_close(replica, value, rtol, rtol) : compare_exact(replica, value);
      if (diff) {
        fail(ErrorKind::kShapeMismatch,
             "replicas disagree: devices {} and {} hold different values for box {} ({})", d, other,
             to_string(box), *diff);
      }
    }
    copy_box(value, full_box(value.shape()), global, box.offset);
  }
  return global;
}

}  // namespace meshflow
