// Point-to-point planning. Source shard boxes form a grid: along each tensor dim, the mesh dims
// sharding it cut it into intervals. For each destination device the planner walks the source
// "classes" (coordinates on the source's Shard dims) whose boxes meet its box, and for each term
// (coordinates on the reduced Partial dims) picks one holder among the replicas (coordinates on
// Replicate dims), preferring the destination device itself, else spreading load by position.
#include "meshflow/plan/point_to_point.h"

#include <algorithm>
#include <map>

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

Step plan_point_to_point(const Layout& from, const Layout& to, const MachineModel& machine) {
  check_redistributable(from, to);
  const DeviceMesh& sm = from.mesh;
  const bool same_mesh = sm == to.mesh;
  std::vector<MeshDim> shard_dims, reduce_dims, kept_dims, rep_dims;
  const std::vector<MeshDim> reduced = reduced_partial_dims(from, to);
  for (std::size_t m = 0; m < from.placements.size(); ++m) {
    const MeshDim md = static_cast<MeshDim>(m);
    const Placement& p = from.placements[m];
    if (p.is_shard()) shard_dims.push_back(md);
    if (p.is_replicate()) rep_dims.push_back(md);
    if (p.is_partial())
      (std::find(reduced.begin(), reduced.end(), md) != reduced.end() ? reduce_dims : kept_dims)
          .push_back(md);
  }
  Step step{.kind = StepKind::kPointToPoint, .before = from.placements, .after = to.placements};
  step.terms = 1;
  for (MeshDim m : reduce_dims) step.terms *= static_cast<int>(sm.shape[m]);

  // Source classes: one box per coordinate tuple on the shard dims.
  struct SourceClass {
    std::vector<std::int64_t> coords;  // full mesh coordinates with non-shard dims 0
    Box box;
  };
  std::vector<SourceClass> classes;
  for_each_coords(sm, shard_dims, [&](const std::vector<std::int64_t>& v) {
    std::vector<std::int64_t> c(sm.shape.size(), 0);
    for (std::size_t k = 0; k < shard_dims.size(); ++k) c[shard_dims[k]] = v[k];
    classes.push_back({c, shard_box_at(from, c)});
  });
  std::int64_t replicas = 1;
  for (MeshDim m : rep_dims) replicas *= sm.shape[m];
  const std::int64_t es = static_cast<std::int64_t>(size_of(from.dtype));

  std::map<DeviceId, std::int64_t> received;
  std::map<DeviceId, std::map<DeviceId, bool>> peers;
  for (std::size_t pos = 0; pos < to.mesh.devices.size(); ++pos) {
    const DeviceId dst = to.mesh.devices[pos];
    const Box want = shard_box(to, dst);
    if (numel(want) == 0) continue;
    std::vector<std::int64_t> dst_coords;
    if (same_mesh) dst_coords = coordinates(sm, dst);
    const auto dst_in_src = find_device(sm, dst);
    std::vector<std::int64_t> dst_src_coords;
    if (dst_in_src) dst_src_coords = coordinates(sm, dst);
    for (const SourceClass& cls : classes) {
      const Box piece = intersect(want, cls.box);
      if (numel(piece) == 0) continue;
      int term = 0;
      for_each_coords(sm, reduce_dims, [&](const std::vector<std::int64_t>& t) {
        std::vector<std::int64_t> c = cls.coords;
        for (std::size_t k = 0; k < reduce_dims.size(); ++k) c[reduce_dims[k]] = t[k];
        for (MeshDim m : kept_dims) c[m] = dst_coords[m];
        // Choose the replica: the destination itself if it holds this term and box, else the
        // replica at position (pos mod replicas).
        DeviceId src = -1;
        if (dst_in_src) {
          bool same = true;
          for (std::size_t m = 0; m < c.size(); ++m) {
            const bool is_rep = std::find(rep_dims.begin(), rep_dims.end(),
                                          static_cast<MeshDim>(m)) != rep_dims.end();
            if (!is_rep && c[m] != dst_src_coords[m]) same = false;
          }
          if (same) src = dst;
        }
        if (src < 0) {
          std::int64_t r = static_cast<std::int64_t>(pos) % replicas;
          for (std::size_t k = rep_dims.size(); k-- > 0;) {
            c[rep_dims[k]] = r % sm.shape[rep_dims[k]];
            r /= sm.shape[rep_dims[k]];
          }
          src = device_at(sm, c);
        }
        step.transfers.push_back(Transfer{src, dst, term, piece});
        if (src != dst) {
          received[dst] += numel(piece) * es;
          peers[dst][src] = true;
        }
        ++term;
      });
    }
  }
  std::size_t max_peers = 0;
  for (const auto& [d, bytes] : received) {
    step.bytes_per_device = std::max(step.bytes_per_device, bytes);
    step.total_bytes += bytes;
    max_peers = std::max(max_peers, peers[d].size());
  }
  const LinkClass& link = link_of(machine, 0);
  const double local_bytes = static_cast<double>(
      numel(shard_box_at(to, std::vector<std::int64_t>(to.mesh.shape.size(), 0))) * es);
  step.est_s = machine.collective_overhead_us * 1e-6 +
               static_cast<double>(max_peers) * link.latency_us * 1e-6 +
               step.bytes_per_device / (link.bandwidth_gbps * 1e9) +
               step.terms * local_bytes / (machine.memcpy_gbps * 1e9);
  return step;
}

}  // namespace meshflow
