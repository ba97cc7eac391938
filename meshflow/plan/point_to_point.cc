// Point-to-point planning. Source shard boxes form a grid: along each tensor dim, the mesh dims
// sharding it cut it into intervals. For each destination device the planner walks the source
// "classes" (coordinates on the source's Shard dims) whose boxes meet its box, and for each term
// (coordinates on the reduced Partial dims) picks one holder among the replicas (coordinates on
// Replicate dims), preferring the destination device itself, else spreading load by position.
#include "meshflow/plan/point_to_point.h"

#include <algorithm>
#include <map>
#include <set>

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
// destination at position `pos`: the destination itself when it holds them, else the replica at
// position (pos mod replicas), spreading load.
DeviceId choose_holder(const Layout& from, const SourceRoles& roles, std::vector<std::int64_t> c,
                       DeviceId dst, std::size_t pos) {
  if (find_device(from.mesh, dst)) {
    const std::vector<std::int64_t> mine = coordinates(from.mesh, dst);
    bool same = true;
    for (std::size_t m = 0; m < c.size(); ++m) {
      const bool rep = std::find(roles.replicate.begin(), roles.replicate.end(),
                                 static_cast<MeshDim>(m)) != roles.replicate.end();
      same = same && (rep || c[m] == mine[m]);
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

Step plan_point_to_point(const Layout& from, const Layout& to, const MachineModel& machine) {
  const bool same_mesh = from.mesh == to.mesh;
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

  const std::vector<SourceClass> classes = source_classes(from, roles.shard);
  const auto es = static_cast<std::int64_t>(size_of(from.dtype));
  std::map<DeviceId, std::int64_t> received;
  std::map<DeviceId, std::set<DeviceId>> peers;
  for (std::size_t pos = 0; pos < to.mesh.devices.size(); ++pos) {
    const DeviceId dst = to.mesh.devices[pos];
    const Box want = shard_box(to, dst);
    if (numel(want) == 0) continue;
    const std::vector<std::int64_t> dst_coords =
        same_mesh ? coordinates(from.mesh, dst) : std::vector<std::int64_t>();
    for (const SourceClass& cls : classes) {
      const Box piece = intersect(want, cls.box);
      if (numel(piece) == 0) continue;
      int term = 0;
      for_each_coords(from.mesh, roles.reduce, [&](const std::vector<std::int64_t>& t) {
        std::vector<std::int64_t> c = cls.coords;
        for (std::size_t k = 0; k < roles.reduce.size(); ++k) c[roles.reduce[k]] = t[k];
        for (MeshDim m : roles.kept) c[m] = dst_coords[m];
        const DeviceId src = choose_holder(from, roles, c, dst, pos);
        step.transfers.push_back(Transfer{src, dst, term, piece});
        if (src != dst) {
          received[dst] += numel(piece) * es;
          peers[dst].insert(src);
        }
        ++term;
      });
    }
  }
  std::int64_t max_peers = 0;
  for (const auto& [d, bytes] : received) {
    step.bytes_per_device = std::max(step.bytes_per_device, bytes);
    step.total_bytes += bytes;
    max_peers = std::max(max_peers, static_cast<std::int64_t>(peers[d].size()));
  }
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

}  // namespace meshflow
