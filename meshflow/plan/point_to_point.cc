// Point-to-point planning. Source shard boxes form a grid: along each tensor dim, the mesh dims
// sharding it cut it into intervals. For each destination device the planner walks the source
// "classes" (coordinates on the source's Shard dims) whose boxes meet its box, and for each term
// (coordinates on the reduced Partial dims) picks one holder among the replicas (coordinates on
// Replicate dims), preferring the destination device itself, else spreading load by position.
#include "meshflow/plan/point_to_point.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "meshflow/core/error.h"
#include "meshflow/plan/transitions.h"

namespace meshflow {

namespace {

// Enumerates all coordinate tuples over `dims` of `mesh` (row-major), calling fn(values).
template <typename Fn>
void for_each_coords(const DeviceMesh& mesh, const std::vector<MeshDim>& dims, Fn fn) {
  std::vector<std::int64_t> idx(dims.size(), 0);
  while (true) {
    fn(idx);
    std::size_t k = dims.size();
    while (k > 0) {
      --k;
      if (++idx[k] < mesh.shape[dims[k]]) break;
      idx[k] = 0;
      if (k == 0) return;
    }
    if (dims.empty()) return;
  }
}

}  // namespace

namespace {

// The source mesh dims by role: Shard dims cut the tensor into classes, reduced Partial dims
// give the terms each destination receives, kept Partial dims keep their terms (same mesh
// only), Replicate dims hold copies.
struct SourceRoles {
  std::vector<MeshDim> shard, reduce, kept, replicate;
};

SourceRoles source_roles(const Layout& from, const std::vector<MeshDim>& reduced) {
  SourceRoles r;
  for (std::size_t m = 0; m < from.placements.size(); ++m) {
    const MeshDim md = static_cast<MeshDim>(m);
    const Placement& p = from.placements[m];
    if (p.is_shard()) r.shard.push_back(md);
    if (p.is_replicate()) r.replicate.push_back(md);
    if (p.is_partial())
      (std::find(reduced.begin(), reduced.end(), md) != reduced.end() ? r.reduce : r.kept)
          .push_back(md);
  }
  return r;
}

// One box per coordinate tuple on the Shard dims (other coordinates 0).
struct SourceClass {
  std::vector<std::int64_t> coords;
  Box box;
};

std::vector<SourceClass> source_classes(const Layout& from, const std::vector<MeshDim>& shard) {
  std::vector<SourceClass> classes;
  for_each_coords(from.mesh, shard, [&](const std::vector<std::int64_t>& v) {
    std::vector<std::int64_t> c(from.mesh.shape.size(), 0);
    for (std::size_t k = 0; k < shard.size(); ++k) c[shard[k]] = v[k];
    classes.push_back({c, shard_box_at(from, c)});
  });
  return classes;
}

// Returns the device that sends term coordinates `c` (all but the Replicate dims set) to the
// destination at position `pos` of the destination mesh, whose coordinates on the source mesh
// are `dst_coords` (null when the source mesh lacks it): the destination itself when it holds
// them, else the replica at position (pos mod replicas), spreading load.
DeviceId choose_holder(const Layout& from, const SourceRoles& roles, std::vector<std::int64_t> c,
                       DeviceId dst, const std::vector<std::int64_t>* dst_coords, std::size_t pos) {
  if (dst_coords) {
    bool same = true;
    for (std::size_t m = 0; m < c.size(); ++m) {
      const bool rep = std::find(roles.replicate.begin(), roles.replicate.end(),
                                 static_cast<MeshDim>(m)) != roles.replicate.end();
      same = same && (rep || c[m] == (*dst_coords)[m]);
    }
    if (same) return dst;
  }
  std::int64_t replicas = 1;
  for (MeshDim m : roles.replicate) replicas *= from.mesh.shape[m];
  std::int64_t r = static_cast<std::int64_t>(pos) % replicas;
  for (std::size_t k = roles.replicate.size(); k-- > 0;) {
    c[roles.replicate[k]] = r % from.mesh.shape[roles.replicate[k]];
    r /= from.mesh.shape[roles.replicate[k]];
  }
  return device_at(from.mesh, c);
}

// Returns the destination mesh dims that become Partial(sum) without receiving the source's
// terms for them: Replicate -> Partial(sum) splits.
std::vector<MeshDim> split_dims(const Layout& from, const Layout& to,
                                const std::vector<MeshDim>& reduced) {
  const bool same_mesh = from.mesh == to.mesh;
  std::vector<MeshDim> out;
  for (std::size_t m = 0; m < to.placements.size(); ++m) {
    const Placement& p = to.placements[m];
    const bool kept =
        same_mesh && from.placements[m].is_partial() &&
        std::find(reduced.begin(), reduced.end(), static_cast<MeshDim>(m)) == reduced.end();
    if (p.is_partial() && p.op == ReduceOp::kSum && !kept) out.push_back(static_cast<MeshDim>(m));
  }
  return out;
}

}  // namespace

namespace {

// Returns each device's row-major position in `mesh` (find_device's, for many lookups).
std::unordered_map<DeviceId, int> positions(const DeviceMesh& mesh) {
  std::unordered_map<DeviceId, int> out;
  for (std::size_t i = 0; i < mesh.devices.size(); ++i)
    out.emplace(mesh.devices[i], static_cast<int>(i));
  return out;
}

// What one destination receives: elements over all terms, those it holds itself (one term of
// its own source class), and how many source (class, term) pieces meet its shard.
struct Receipt {
  std::int64_t elements = 0, own = 0, pieces = 0;
};

// Calls fn(receipt, devices) for classes of destination devices that receive alike: on one
// mesh by sizes_histogram's classes, never device by device; across meshes once per
// destination.
template <typename Fn>
void for_each_receipt(const Layout& from, const Layout& to, int terms, Fn fn) {
  if (from.mesh == to.mesh) {
    for (const auto& [sizes, devices] : sizes_histogram(from, to))
      fn(Receipt{terms * sizes.after, sizes.common, terms * sizes.sources}, devices);
    return;
  }
  std::vector<std::vector<Chunk>> intervals;
  for (std::size_t t = 0; t < from.shape.size(); ++t) intervals.push_back(shard_intervals(from, t));
  const std::unordered_map<DeviceId, int> from_position = positions(from.mesh);
  for (std::size_t pos = 0; pos < to.mesh.devices.size(); ++pos) {
    const Box want = shard_box_at(to, coordinates_at(to.mesh, static_cast<int>(pos)));
    std::int64_t sources = 1;
    for (std::size_t t = 0; t < want.offset.size(); ++t)
      sources *= count_meeting(intervals[t], {.offset = want.offset[t], .extent = want.extent[t]});
    std::int64_t own = 0;
    if (auto it = from_position.find(to.mesh.devices[pos]); it != from_position.end())
      own = numel(intersect(want, shard_box_at(from, coordinates_at(from.mesh, it->second))));
    fn(Receipt{terms * numel(want), own, terms * sources}, 1);
  }
}

}  // namespace

Step plan_point_to_point(const Layout& from, const Layout& to, const MachineModel& machine) {
  const std::vector<MeshDim> reduced = reduced_partial_dims(from, to);
  const SourceRoles roles = source_roles(from, reduced);
  Step step{.kind = StepKind::kPointToPoint, .before = from.placements, .after = to.placements};
  step.reduced_dims = roles.reduce;
  step.terms = 1;
  for (MeshDim m : roles.reduce) step.terms *= static_cast<int>(from.mesh.shape[m]);
  if (!roles.reduce.empty()) {
    std::vector<ReduceOp> ops;
    std::vector<std::int64_t> sizes;
    for (MeshDim m : roles.reduce) {
      ops.push_back(from.placements[m].op);
      sizes.push_back(from.mesh.shape[m]);
    }
    if (auto flat = flat_reduction(ops, sizes)) {
      step.op = flat->op;
      step.divisor = flat->divisor;
    }
  }
  step.split_dims = split_dims(from, to, reduced);
  if (!step.split_dims.empty()) step.split = partial_split_rule(from.dtype);

  // A destination receives every term of every element of its shard but the piece it holds
  // (point_to_point_transfers lists them), each (class, term) piece from a distinct device.
  const auto es = static_cast<std::int64_t>(size_of(from.dtype));
  std::int64_t max_peers = 0;
  for_each_receipt(from, to, step.terms, [&](const Receipt& r, std::int64_t devices) {
    const std::int64_t bytes = (r.elements - r.own) * es;
    step.bytes_per_device = std::max(step.bytes_per_device, bytes);
    step.total_bytes += devices * bytes;
    step.transfers += devices * r.pieces;
    max_peers = std::max(max_peers, r.pieces - (r.own > 0 ? 1 : 0));
  });
  const std::int64_t out_bytes =
      numel(shard_box_at(to, std::vector<std::int64_t>(to.mesh.shape.size(), 0))) * es;
  step.est_s = step_seconds(machine, {.kind = StepKind::kPointToPoint,
                                      .bytes_received = step.bytes_per_device,
                                      .out_bytes = out_bytes,
                                      .scales = step.split == PartialSplit::kDivide,
                                      .peers = max_peers,
                                      .terms = step.terms});
  return step;
}

namespace {

// Appends the transfers destination position `pos` receives, by source class then term.
void receive_at(const Layout& from, const Layout& to, const SourceRoles& roles,
                const std::vector<SourceClass>& classes, std::size_t pos,
                std::vector<Transfer>& out) {
  const DeviceId dst = to.mesh.devices[pos];
  const std::vector<std::int64_t> dst_to = coordinates_at(to.mesh, static_cast<int>(pos));
  const Box want = shard_box_at(to, dst_to);
  if (numel(want) == 0) return;
  std::vector<std::int64_t> dst_from;
  if (from.mesh == to.mesh) {
    dst_from = dst_to;
  } else if (auto p = find_device(from.mesh, dst)) {
    dst_from = coordinates_at(from.mesh, *p);
  }
  const std::vector<std::int64_t>* held = dst_from.empty() ? nullptr : &dst_from;
  for (const SourceClass& cls : classes) {
    const Box piece = intersect(want, cls.box);
    if (numel(piece) == 0) continue;
    int term = 0;
    for_each_coords(from.mesh, roles.reduce, [&](const std::vector<std::int64_t>& t) {
      std::vector<std::int64_t> c = cls.coords;
      for (std::size_t k = 0; k < roles.reduce.size(); ++k) c[roles.reduce[k]] = t[k];
      for (MeshDim m : roles.kept) c[m] = dst_from[m];
      out.push_back(Transfer{choose_holder(from, roles, c, dst, held, pos), dst, term, piece});
      ++term;
    });
  }
}

}  // namespace

std::vector<Transfer> point_to_point_transfers(const Layout& from, const Layout& to) {
  const SourceRoles roles = source_roles(from, reduced_partial_dims(from, to));
  const std::vector<SourceClass> classes = source_classes(from, roles.shard);
  std::vector<Transfer> out;
  for (std::size_t pos = 0; pos < to.mesh.devices.size(); ++pos)
    receive_at(from, to, roles, classes, pos, out);
  return out;
}

std::vector<Transfer> device_transfers(const Layout& from, const Layout& to, DeviceId me) {
  const SourceRoles roles = source_roles(from, reduced_partial_dims(from, to));
  std::vector<Transfer> out;
  if (auto pos = find_device(to.mesh, me)) {
    receive_at(from, to, roles, source_classes(from, roles.shard), static_cast<std::size_t>(*pos),
               out);
  }
  const std::optional<int> src_pos = find_device(from.mesh, me);
  if (!src_pos) return out;
  // Me as a source: one piece (my class, my term) to each destination whose shard meets mine
  // and that picks me as its holder.
  const std::vector<std::int64_t> mine = coordinates_at(from.mesh, *src_pos);
  const Box own = shard_box_at(from, mine);
  if (numel(own) == 0) return out;
  int term = 0;
  for (MeshDim m : roles.reduce)
    term = term * static_cast<int>(from.mesh.shape[m]) + static_cast<int>(mine[m]);
  std::vector<std::int64_t> c = mine;
  for (MeshDim m : roles.replicate) c[m] = 0;
  const bool same_mesh = from.mesh == to.mesh;
  const std::unordered_map<DeviceId, int> from_position =
      same_mesh ? std::unordered_map<DeviceId, int>() : positions(from.mesh);
  for (std::size_t pos = 0; pos < to.mesh.devices.size(); ++pos) {
    const DeviceId dst = to.mesh.devices[pos];
    if (dst == me) continue;  // my own piece is among my receipts
    const std::vector<std::int64_t> dst_to = coordinates_at(to.mesh, static_cast<int>(pos));
    const Box piece = intersect(shard_box_at(to, dst_to), own);
    if (numel(piece) == 0) continue;
    std::vector<std::int64_t> dst_from;
    if (same_mesh) {
      dst_from = dst_to;
      // Kept Partial dims: a destination takes the terms of its own coordinates there.
      if (std::any_of(roles.kept.begin(), roles.kept.end(),
                      [&](MeshDim m) { return dst_to[m] != mine[m]; }))
        continue;
    } else if (auto it = from_position.find(dst); it != from_position.end()) {
      dst_from = coordinates_at(from.mesh, it->second);
    }
    if (choose_holder(from, roles, c, dst, dst_from.empty() ? nullptr : &dst_from, pos) == me)
      out.push_back(Transfer{me, dst, term, piece});
  }
  return out;
}

}  // namespace meshflow
