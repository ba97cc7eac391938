#include "meshflow/plan/point_to_point.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "meshflow/plan/transitions.h"

namespace meshflow {
namespace {

// Random placements over k mesh dims of a rank-3 tensor; Partial only where `partial`.
std::vector<Placement> random_placements(std::mt19937& rng, std::size_t k, bool partial) {
  std::vector<Placement> p;
  for (std::size_t m = 0; m < k; ++m) {
    const int pick = static_cast<int>(rng() % 6);
    p.push_back(pick == 0 ? Placement::replicate()
                : pick == 1
                    ? (partial ? Placement::partial(rng() % 2 ? ReduceOp::kSum : ReduceOp::kMax)
                               : Placement::replicate())
                    : Placement::shard(static_cast<int>(rng() % 3)));
  }
  return p;
}

// The step's closed-form figures, recomputed from its transfers listed one by one.
void expect_priced_as_listed(const Layout& from, const Layout& to) {
  const Step step = plan_point_to_point(from, to, default_machine());
  const std::vector<Transfer> all = point_to_point_transfers(from, to);
  const std::string what = to_string(from.mesh) + " " + to_string(from.placements) + " -> " +
                           to_string(to.mesh) + " " + to_string(to.placements) + " " +
                           to_string(from.shape);
  std::map<DeviceId, std::int64_t> received;
  std::map<DeviceId, std::set<DeviceId>> peers;
  std::int64_t total = 0;
  for (const Transfer& t : all) {
    if (t.src == t.dst) continue;
    received[t.dst] += numel(t.box) * 4;
    peers[t.dst].insert(t.src);
    total += numel(t.box) * 4;
  }
  std::int64_t most = 0;
  for (const auto& [d, b] : received) most = std::max(most, b);
  EXPECT_EQ(step.transfers, static_cast<std::int64_t>(all.size())) << what;
  EXPECT_EQ(step.total_bytes, total) << what;
  EXPECT_EQ(step.bytes_per_device, most) << what;
  std::int64_t most_peers = 0;
  for (const auto& [d, from_devices] : peers)
    most_peers = std::max(most_peers, static_cast<std::int64_t>(from_devices.size()));
  const std::int64_t out_bytes =
      numel(shard_box_at(to, std::vector<std::int64_t>(to.mesh.shape.size(), 0))) * 4;
  EXPECT_EQ(step.est_s,
            step_seconds(default_machine(), {.kind = StepKind::kPointToPoint,
                                             .bytes_received = most,
                                             .out_bytes = out_bytes,
                                             .scales = step.split == PartialSplit::kDivide,
                                             .peers = most_peers,
                                             .terms = step.terms}))
      << what << " peers " << most_peers;
  // Every destination receives each element of its shard once per term.
  std::map<DeviceId, std::int64_t> elements;
  for (const Transfer& t : all) elements[t.dst] += numel(t.box);
  for (DeviceId d : to.mesh.devices)
    EXPECT_EQ(elements[d], numel(shard_box(to, d)) * step.terms) << what << " device " << d;
  // Each device's own share, built for it alone, is exactly its part of the list.
  std::set<DeviceId> devices(from.mesh.devices.begin(), from.mesh.devices.end());
  devices.insert(to.mesh.devices.begin(), to.mesh.devices.end());
  for (DeviceId me : devices) {
    std::vector<Transfer> want;
    for (const Transfer& t : all)
      if (t.src == me || t.dst == me) want.push_back(t);
    std::vector<Transfer> got = device_transfers(from, to, me);
    auto order = [](const Transfer& a, const Transfer& b) {
      return std::tie(a.src, a.dst, a.term, a.box.offset) <
             std::tie(b.src, b.dst, b.term, b.box.offset);
    };
    std::sort(want.begin(), want.end(), order);
    std::sort(got.begin(), got.end(), order);
    EXPECT_EQ(got, want) << what << " device " << me;
  }
}

// Random layouts on one mesh (Partial sources reduced or kept, uneven and empty shards) and
// across meshes (disjoint and overlapping): the step priced without listing its transfers moves
// what listing them moves, and each device's share matches the list.
TEST(PointToPoint, PricedInClosedFormAsItsTransfersListedOneByOne) {
  std::mt19937 rng(11);
  const std::vector<std::string> meshes = {"3x2", "2x3x2", "4x1x3", "5", "2x2x2", "2x4"};
  const std::vector<Shape> shapes = {{5, 7, 3}, {2, 9, 4}, {6, 1, 11}, {8, 4, 16}, {16, 8, 8}};
  for (int trial = 0; trial < 120; ++trial) {
    const DeviceMesh mesh = parse_mesh(meshes[static_cast<std::size_t>(trial) % meshes.size()]);
    const Shape& shape = shapes[static_cast<std::size_t>(trial) % shapes.size()];
    const std::size_t k = mesh.shape.size();
    const Layout from = make_layout(mesh, random_placements(rng, k, true), shape, DType::kFloat32);
    std::vector<Placement> to_p = random_placements(rng, k, false);
    // A Partial kept where the source has one (same op): its terms stay.
    for (std::size_t m = 0; m < k; ++m)
      if (from.placements[m].is_partial() && rng() % 2) to_p[m] = from.placements[m];
    const Layout to = make_layout(mesh, to_p, shape, DType::kFloat32);
    SCOPED_TRACE(trial);
    expect_priced_as_listed(from, to);
  }
  for (int trial = 0; trial < 60; ++trial) {
    const Shape& shape = shapes[static_cast<std::size_t>(trial) % shapes.size()];
    const DeviceMesh a = parse_mesh(trial % 2 ? "2x3" : "4");
    // Disjoint, or sharing devices 2..5 with the source, in a shuffled order.
    std::vector<DeviceId> ids =
        trial % 3 ? std::vector<DeviceId>{6, 7, 8, 9} : std::vector<DeviceId>{5, 2, 4, 3};
    if (trial % 3 == 1) ids = {2, 3, 4, 5, 10, 11, 12, 13};
    const DeviceMesh b = make_mesh(ids.size() == 8 ? Shape{2, 4} : Shape{2, 2}, ids);
    const Layout from =
        make_layout(a, random_placements(rng, a.shape.size(), true), shape, DType::kFloat32);
    const Layout to =
        make_layout(b, random_placements(rng, b.shape.size(), false), shape, DType::kFloat32);
    SCOPED_TRACE(trial);
    expect_priced_as_listed(from, to);
  }
}

// On a mesh of 65,536 devices the step is priced from classes of devices, without a visit per
// device (as `bench plan` measures).
TEST(PointToPoint, PricedOnLargeMeshesWithoutVisitingDevices) {
  const DeviceMesh mesh = parse_mesh("16x16x16x16");
  const Shape shape{4096, 4096};
  const Step step = plan_point_to_point(
      make_layout(mesh, parse_placements("S(0),S(1),R,R"), shape, DType::kFloat32),
      make_layout(mesh, parse_placements("S(1),S(0),R,R"), shape, DType::kFloat32),
      default_machine());
  // Device (i, j, ., .) holds the 256x256 block (i, j) and wants block (j, i): one piece from
  // one source, its own where i == j (16 x 256 devices).
  EXPECT_EQ(step.bytes_per_device, 256 * 256 * 4);
  EXPECT_EQ(step.transfers, 65536);
  EXPECT_EQ(step.total_bytes, std::int64_t{256} * 256 * 4 * (65536 - 16 * 256));
}

}  // namespace
}  // namespace meshflow
