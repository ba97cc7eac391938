// Move validity, step construction, byte counts and the lower bound.
#include "meshflow/plan/transitions.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "meshflow/core/error.h"

namespace meshflow {

Layout with_placements(const Layout& layout, std::vector<Placement> placements) {
  Layout out = layout;
  out.placements = std::move(placements);
  return out;
}

void check_redistributable(const Layout& from, const Layout& to) {
  if (from.shape != to.shape || from.dtype != to.dtype) {
    fail(ErrorKind::kShapeMismatch, "cannot redistribute a {} {} tensor into a layout for {} {}",
         to_string(from.shape), to_string(from.dtype), to_string(to.shape), to_string(to.dtype));
  }
  if (!(from.mesh == to.mesh)) return;  // cross-mesh: values are rebuilt on the destination
  for (std::size_t m = 0; m < from.placements.size(); ++m) {
    const Placement& a = from.placements[m];
    const Placement& b = to.placements[m];
    if (a.is_shard() && b.is_partial()) {
      fail(ErrorKind::kInvalidArgument,
           "cannot redistribute mesh dim {} from {} to {}: a shard cannot become a partial term", m,
           to_string(a), to_string(b));
    }
    if (a.is_partial() && b.is_partial() && a.op != b.op) {
      fail(ErrorKind::kInvalidArgument,
           "cannot redistribute mesh dim {} from {} to {}: partial ops differ", m, to_string(a),
           to_string(b));
    }
  }
}

std::vector<Placement> settle_unit_dims(const DeviceMesh& mesh, std::vector<Placement> placements,
                                        const std::vector<Placement>& target) {
  for (std::size_t m = 0; m < placements.size(); ++m) {
    if (mesh.shape[m] == 1) placements[m] = target[m];
  }
  return placements;
}

namespace {

// Returns true when a mesh dim of size > 1, not in `dims` and inner to min(dims), shards
// tensor dim `d` in `placements`.
bool inner_shard_outside(const Layout& layout, const std::vector<Placement>& placements,
                         const std::vector<MeshDim>& dims, int d) {
  for (std::size_t m = dims.front() + 1; m < placements.size(); ++m) {
    if (layout.mesh.shape[m] == 1 ||
        std::find(dims.begin(), dims.end(), static_cast<MeshDim>(m)) != dims.end())
      continue;
    if (placements[m] == Placement::shard(d)) return true;
  }
  return false;
}

// Returns true when tensor dim d divides evenly by the product of the sizes of the mesh dims
// sharding it in `placements` (or in `dims`) up to and including the last mesh dim of `dims`.
bool divides_evenly(const Layout& layout, const std::vector<Placement>& placements,
                    const std::vector<MeshDim>& dims, int d) {
  std::int64_t parts = 1;
  for (int m = 0; m <= dims.back(); ++m) {
    bool in = std::find(dims.begin(), dims.end(), m) != dims.end();
    if (in || placements[m] == Placement::shard(d)) parts *= layout.mesh.shape[m];
  }
  return layout.shape[d] % parts == 0;
}

// Returns true when a Partial dim of size > 1, not in `dims` and inner to some dim of `dims`,
// has an op incompatible with the op of that dim (invariant 4).
bool incompatible_inner_partial(const Layout& layout, const std::vector<Placement>& placements,
                                const std::vector<MeshDim>& dims) {
  for (MeshDim m : dims) {
    for (std::size_t m2 = m + 1; m2 < placements.size(); ++m2) {
      if (layout.mesh.shape[m2] == 1 ||
          std::find(dims.begin(), dims.end(), static_cast<MeshDim>(m2)) != dims.end())
        continue;
      if (placements[m2].is_partial() && !compatible_ops(placements[m2].op, placements[m].op))
        return true;
    }
  }
  return false;
}

}  // namespace

bool compatible_ops(ReduceOp a, ReduceOp b) {
  auto additive = [](ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAvg; };
  return a == b || (additive(a) && additive(b));
}

namespace {

// Returns the kind every dim of `dims` moves by (before[m] -> after[m]), or nullopt when a dim
// does not change or the dims move by different kinds.
std::optional<StepKind> common_kind(const std::vector<Placement>& cur,
                                    const std::vector<Placement>& after,
                                    const std::vector<MeshDim>& dims) {
  std::optional<StepKind> kind;
  for (MeshDim m : dims) {
    const Placement& p = cur[m];
    const Placement& q = after[m];
    std::optional<StepKind> k;
    if (p == q) return std::nullopt;
    if (p.is_shard() && q.is_replicate()) k = StepKind::kAllGather;
    if (p.is_partial() && q.is_replicate()) k = StepKind::kAllReduce;
    if (p.is_partial() && q.is_shard()) k = StepKind::kReduceScatter;
    if (p.is_shard() && q.is_shard()) k = StepKind::kAllToAll;
    if (p.is_replicate()) k = StepKind::kLocal;
    if (!k || (kind && *kind != *k)) return std::nullopt;
    kind = k;
  }
  return kind;
}

// The invariants of transitions.h for one kind of move.
bool valid_gather(const Layout& before, const std::vector<MeshDim>& dims) {
  const auto& cur = before.placements;
  const int d = cur[dims[0]].dim;
  for (MeshDim m : dims) {
    if (cur[m].dim != d) return false;
  }
  return !inner_shard_outside(before, cur, dims, d) &&
         (dims.size() == 1 || divides_evenly(before, cur, dims, d));
}

bool valid_all_reduce(const Layout& before, const std::vector<MeshDim>& dims) {
  const auto& cur = before.placements;
  bool sum_avg = true, same = true;
  for (MeshDim m : dims) {
    sum_avg = sum_avg && (cur[m].op == ReduceOp::kSum || cur[m].op == ReduceOp::kAvg);
    same = same && cur[m].op == cur[dims[0]].op;
  }
  return (sum_avg || same) && !incompatible_inner_partial(before, cur, dims);
}

bool valid_reduce_scatter(const Layout& before, const std::vector<Placement>& after,
                          const std::vector<MeshDim>& dims) {
  const auto& cur = before.placements;
  const int d = after[dims[0]].dim;
  for (MeshDim m : dims) {
    if (after[m].dim != d || cur[m].op != cur[dims[0]].op) return false;
  }
  return !inner_shard_outside(before, cur, dims, d) &&
         (dims.size() == 1 || divides_evenly(before, cur, dims, d)) &&
         !incompatible_inner_partial(before, cur, dims);
}

bool valid_all_to_all(const Layout& before, const std::vector<Placement>& after,
                      const std::vector<MeshDim>& dims) {
  const auto& cur = before.placements;
  return dims.size() == 1 && !inner_shard_outside(before, cur, dims, cur[dims[0]].dim) &&
         !inner_shard_outside(before, cur, dims, after[dims[0]].dim);
}

bool valid_local(const Layout& before, const std::vector<Placement>& after,
                 const std::vector<MeshDim>& dims) {
  const auto& cur = before.placements;
  for (MeshDim m : dims) {
    if (after[m].is_shard() && inner_shard_outside(before, cur, {m}, after[m].dim)) return false;
    // Chunking several dims at once must follow the outer-first rule among themselves too.
    for (MeshDim m2 : dims) {
      if (m2 > m && after[m].is_shard() && cur[m2] == Placement::shard(after[m].dim)) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<StepKind> classify_move(const Layout& before, const std::vector<Placement>& after,
                                      const std::vector<MeshDim>& dims) {
  if (dims.empty()) return std::nullopt;
  const std::optional<StepKind> kind = common_kind(before.placements, after, dims);
  if (!kind) return std::nullopt;
  bool valid = false;
  switch (*kind) {
    case StepKind::kAllGather:
      valid = valid_gather(before, dims);
      break;
    case StepKind::kAllReduce:
      valid = valid_all_reduce(before, dims);
      break;
    case StepKind::kReduceScatter:
      valid = valid_reduce_scatter(before, after, dims);
      break;
    case StepKind::kAllToAll:
      valid = valid_all_to_all(before, after, dims);
      break;
    case StepKind::kLocal:
      valid = valid_local(before, after, dims);
      break;
    case StepKind::kPointToPoint:
    case StepKind::kPermute:  // decomposed collectives are not plan steps
    case StepKind::kBroadcast:
    case StepKind::kInPlace:
      break;
  }
  return valid ? kind : std::nullopt;
}

PartialSplit partial_split_rule(DType dtype) {
  return is_floating(dtype) ? PartialSplit::kDivide : PartialSplit::kFirstKeeps;
}

FlatReduction reduction_of(const Layout& before, const std::vector<MeshDim>& dims) {
  std::vector<ReduceOp> ops;
  std::vector<std::int64_t> sizes;
  for (MeshDim m : dims) {
    ops.push_back(before.placements[m].op);
    sizes.push_back(before.mesh.shape[m]);
  }
  const auto flat = flat_reduction(ops, sizes);
  MESHFLOW_CHECK(flat.has_value(), "mesh dims with incompatible Partial ops reduced in one step");
  return *flat;
}

namespace {

std::vector<std::int64_t> zero_coords(const Layout& l) {
  return std::vector<std::int64_t>(l.mesh.shape.size(), 0);
}

std::int64_t group_size(const Layout& l, const std::vector<MeshDim>& dims) {
  std::int64_t n = 1;
  for (MeshDim m : dims) n *= l.mesh.shape[m];
  return n;
}

ShardSizes sizes_at(const Layout& before, const Layout& after,
                    const std::vector<std::int64_t>& coords) {
  const Box b = shard_box_at(before, coords);
  const Box a = shard_box_at(after, coords);
  return {numel(b), numel(a), numel(intersect(a, b))};
}

// Returns the bytes a device whose shards have `sizes` receives in a step of `kind` over groups
// of n devices.
std::int64_t received(StepKind kind, std::int64_t n, std::int64_t es, const ShardSizes& sizes) {
  switch (kind) {
    case StepKind::kAllGather:
      return (sizes.after - sizes.before) * es;
    case StepKind::kReduceScatter:
      return (n - 1) * sizes.after * es;
    case StepKind::kAllReduce:
      return 2 * (n - 1) * sizes.before / n * es;
    case StepKind::kAllToAll:
      return (sizes.after - sizes.common) * es;
    default:
      return 0;
  }
}

// Returns tensor dim t of the shard at `coords` (shard_box_at's, without building the box).
Chunk shard_interval(const Layout& l, std::size_t t, const std::vector<std::int64_t>& coords) {
  Chunk out{.offset = 0, .extent = l.shape[t]};
  for (std::size_t m = 0; m < l.placements.size(); ++m) {
    const Placement& p = l.placements[m];
    if (!p.is_shard() || static_cast<std::size_t>(p.dim) != t) continue;
    const Chunk c = chunk(out.extent, l.mesh.shape[m], coords[m]);
    out.offset += c.offset;
    out.extent = c.extent;
  }
  return out;
}

// Returns the one ShardSizes every device has over `tensor_dims` when it needs no enumeration:
// on each of those dims, one layout's sharding mesh dims (in mesh order) begin with the other's,
// and every level divides its extent evenly. Then every shard of the finer layout lies inside
// one of the coarser's (their intersection is the finer shard), and all shards of a layout are
// equal. Otherwise nullopt.
std::optional<ShardSizes> uniform_sizes(const Layout& before, const Layout& after,
                                        const std::vector<std::size_t>& tensor_dims) {
  ShardSizes s{1, 1, 1, 1};
  for (std::size_t t : tensor_dims) {
    std::array<std::vector<std::size_t>, 2> dims;
    std::array<std::int64_t, 2> extent{before.shape[t], before.shape[t]};
    for (std::size_t i = 0; i < 2; ++i) {
      const Layout& l = i == 0 ? before : after;
      for (std::size_t m = 0; m < l.placements.size(); ++m) {
        if (!l.placements[m].is_shard() || static_cast<std::size_t>(l.placements[m].dim) != t)
          continue;
        if (extent[i] % l.mesh.shape[m] != 0) return std::nullopt;
        extent[i] /= l.mesh.shape[m];
        dims[i].push_back(m);
      }
    }
    const std::size_t common = std::min(dims[0].size(), dims[1].size());
    if (!std::equal(dims[0].begin(), dims[0].begin() + static_cast<std::ptrdiff_t>(common),
                    dims[1].begin()))
      return std::nullopt;
    s.before *= extent[0];
    s.after *= extent[1];
    s.common *= std::min(extent[0], extent[1]);
    // The finer layout's shard lies in one of the coarser's; a coarser after-shard covers
    // extent[1] / extent[0] before-shards.
    s.sources *=
        extent[0] == 0 || extent[1] == 0 ? 0 : std::max<std::int64_t>(1, extent[1] / extent[0]);
  }
  return s;
}

}  // namespace

std::vector<Chunk> shard_intervals(const Layout& l, std::size_t t) {
  std::vector<Chunk> out{{.offset = 0, .extent = l.shape[t]}};
  for (std::size_t m = 0; m < l.placements.size(); ++m) {
    const Placement& p = l.placements[m];
    if (!p.is_shard() || static_cast<std::size_t>(p.dim) != t) continue;
    std::vector<Chunk> finer;  // outer mesh dims first: each interval splits in place
    for (const Chunk& c : out) {
      for (std::int64_t i = 0; i < l.mesh.shape[m]; ++i) {
        const Chunk part = chunk(c.extent, l.mesh.shape[m], i);
        finer.push_back({.offset = c.offset + part.offset, .extent = part.extent});
      }
    }
    out = std::move(finer);
  }
  std::erase_if(out, [](const Chunk& c) { return c.extent == 0; });
  return out;
}

std::int64_t count_meeting(const std::vector<Chunk>& intervals, Chunk c) {
  if (c.extent == 0) return 0;
  // Disjoint and ascending: both starts and ends ascend.
  const auto first = std::partition_point(intervals.begin(), intervals.end(), [&](const Chunk& i) {
    return i.offset + i.extent <= c.offset;
  });
  const auto last = std::partition_point(
      first, intervals.end(), [&](const Chunk& i) { return i.offset < c.offset + c.extent; });
  return last - first;
}

std::map<ShardSizes, std::int64_t> sizes_histogram(const Layout& before, const Layout& after) {
  const std::size_t k = before.mesh.shape.size(), r = before.shape.size();
  // group[t]: tensor dim t's group (union-find over tensor dims).
  std::vector<std::size_t> group(r);
  for (std::size_t t = 0; t < r; ++t) group[t] = t;
  auto find = [&](std::size_t t) {
    while (group[t] != t) t = group[t] = group[group[t]];
    return t;
  };
  std::vector<std::vector<std::size_t>> sharded(k);  // tensor dims mesh dim m shards
  for (std::size_t m = 0; m < k; ++m) {
    for (const Layout* l : {&before, &after}) {
      if (l->placements[m].is_shard())
        sharded[m].push_back(static_cast<std::size_t>(l->placements[m].dim));
    }
    for (std::size_t t : sharded[m]) group[find(t)] = find(sharded[m].front());
  }
  std::map<ShardSizes, std::int64_t> all{{ShardSizes{1, 1, 1, 1}, 1}};
  std::vector<bool> used_tensor(r, false);
  for (std::size_t m = 0; m < k; ++m) {
    if (sharded[m].empty()) all.begin()->second *= before.mesh.shape[m];
  }
  for (std::size_t root = 0; root < r; ++root) {
    if (find(root) != root) continue;
    std::vector<std::size_t> tensor_dims, mesh_dims;
    for (std::size_t t = 0; t < r; ++t)
      if (find(t) == root) tensor_dims.push_back(t);
    for (std::size_t m = 0; m < k; ++m)
      if (!sharded[m].empty() && find(sharded[m].front()) == root) mesh_dims.push_back(m);
    std::map<ShardSizes, std::int64_t> part;
    const std::optional<ShardSizes> same = uniform_sizes(before, after, tensor_dims);
    if (same) {
      std::int64_t devices = 1;
      for (std::size_t m : mesh_dims) devices *= before.mesh.shape[m];
      part[*same] = devices;
    }
    std::vector<std::vector<Chunk>> before_intervals;
    if (!same) {
      for (std::size_t t : tensor_dims) before_intervals.push_back(shard_intervals(before, t));
    }
    std::vector<std::int64_t> coords(k, 0);
    while (!same) {
      ShardSizes s{1, 1, 1, 1};
      for (std::size_t i = 0; i < tensor_dims.size(); ++i) {
        const std::size_t t = tensor_dims[i];
        const Chunk b = shard_interval(before, t, coords), a = shard_interval(after, t, coords);
        s.before *= b.extent;
        s.after *= a.extent;
        s.common *= std::max<std::int64_t>(
            0, std::min(a.offset + a.extent, b.offset + b.extent) - std::max(a.offset, b.offset));
        s.sources *= count_meeting(before_intervals[i], a);
      }
      ++part[s];
      std::size_t i = 0;  // the odometer over this group's mesh dims
      for (; i < mesh_dims.size(); ++i) {
        if (++coords[mesh_dims[i]] < before.mesh.shape[mesh_dims[i]]) break;
        coords[mesh_dims[i]] = 0;
      }
      if (i == mesh_dims.size()) break;
    }
    std::map<ShardSizes, std::int64_t> next;
    for (const auto& [x, cx] : all) {
      for (const auto& [y, cy] : part) {
        next[{x.before * y.before, x.after * y.after, x.common * y.common,
              x.sources * y.sources}] += cx * cy;
      }
    }
    all = std::move(next);
  }
  return all;
}

Step make_step(const Layout& before, const Move& move, const MachineModel& machine) {
  const Layout after = with_placements(before, move.after);
  Step step{
      .kind = move.kind, .mesh_dims = move.dims, .before = before.placements, .after = move.after};
  const auto origin = zero_coords(before);  // the device with the largest shard
  step.bytes_per_device =
      received(move.kind, group_size(before, move.dims),
               static_cast<std::int64_t>(size_of(before.dtype)), sizes_at(before, after, origin));
  if (move.kind == StepKind::kAllReduce || move.kind == StepKind::kReduceScatter) {
    step.reduced_dims = move.dims;
    const FlatReduction flat = reduction_of(before, move.dims);
    step.op = flat.op;
    step.divisor = flat.divisor;
  }
  if (move.kind == StepKind::kLocal) {
    for (MeshDim m : move.dims) {
      if (move.after[m].is_partial() && move.after[m].op == ReduceOp::kSum)
        step.split_dims.push_back(m);
    }
    if (!step.split_dims.empty()) step.split = partial_split_rule(before.dtype);
  }
  const auto es = static_cast<std::int64_t>(size_of(before.dtype));
  step.est_s = step_seconds(machine, {.kind = move.kind,
                                      .mesh_dims = move.dims,
                                      .group_size = group_size(before, move.dims),
                                      .bytes_received = step.bytes_per_device,
                                      .in_bytes = numel(shard_box_at(before, origin)) * es,
                                      .out_bytes = numel(shard_box_at(after, origin)) * es,
                                      .scales = step.split == PartialSplit::kDivide});
  return step;
}

std::int64_t fill_totals(const Layout& from, std::vector<Step>& steps) {
  std::int64_t total = 0;
  for (Step& s : steps) {
    if (s.kind == StepKind::kPointToPoint) {
      total += s.total_bytes;  // computed by the point-to-point planner from its transfers
      continue;
    }
    const Layout before = with_placements(from, s.before), after = with_placements(from, s.after);
    const std::int64_t n = group_size(before, s.mesh_dims);
    const auto es = static_cast<std::int64_t>(size_of(before.dtype));
    s.total_bytes = 0;
    for (const auto& [sizes, devices] : sizes_histogram(before, after))
      s.total_bytes += devices * received(s.kind, n, es, sizes);
    total += s.total_bytes;
  }
  return total;
}

std::vector<MeshDim> reduced_partial_dims(const Layout& from, const Layout& to) {
  const bool same_mesh = from.mesh == to.mesh;
  const std::size_t k = from.placements.size();
  std::vector<bool> reduced(k, false);
  for (std::size_t m = 0; m < k; ++m) {
    const bool kept =
        same_mesh && from.placements[m].is_partial() && to.placements[m] == from.placements[m];
    reduced[m] = from.placements[m].is_partial() && !kept;
  }
  // A Partial dim can keep its terms only if no outer reduced dim has an incompatible op
  // (inner dims reduce first, so such a dim's terms do not survive the outer reduction).
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t m = 0; m < k; ++m) {
      if (reduced[m] || !from.placements[m].is_partial()) continue;
      for (std::size_t r = 0; r < m; ++r) {
        if (reduced[r] && !compatible_ops(from.placements[r].op, from.placements[m].op))
          reduced[m] = grew = true;
      }
    }
  }
  std::vector<MeshDim> dims;
  for (std::size_t m = 0; m < k; ++m) {
    if (reduced[m]) dims.push_back(static_cast<MeshDim>(m));
  }
  return dims;
}

std::int64_t min_bytes(const Layout& from, const Layout& to) {
  const std::int64_t es = static_cast<std::int64_t>(size_of(from.dtype));
  // Terms each destination element needs, from the source's Partial dims not kept as Partial.
  std::int64_t terms = 1;
  for (MeshDim m : reduced_partial_dims(from, to)) terms *= from.mesh.shape[m];
  const bool same_mesh = from.mesh == to.mesh;
  std::int64_t total = 0;
  if (same_mesh) {  // by classes of devices (sizes_histogram), not device by device
    for (const auto& [sizes, devices] : sizes_histogram(from, to)) {
      total += devices * (terms > 1 ? sizes.after * (terms - 1) / terms * es
                                    : (sizes.after - sizes.common) * es);
    }
    return total;
  }
  for (int i = 0; i < size(to.mesh); ++i) {
    const auto coords = coordinates_at(to.mesh, i);
    const Box want = shard_box_at(to, coords);
    if (terms > 1) {
      total += numel(want) * (terms - 1) / terms * es;
      continue;
    }
    std::int64_t held = 0;
    if (same_mesh) {
      held = numel(intersect(want, shard_box_at(from, coords)));
    } else if (find_device(from.mesh, to.mesh.devices[i])) {
      held = numel(intersect(want, shard_box(from, to.mesh.devices[i])));
    }
    total += (numel(want) - held) * es;
  }
  return total;
}

}  // namespace meshflow
