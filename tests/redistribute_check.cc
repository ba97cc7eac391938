// The redistribution reference check.
#include "tests/redistribute_check.h"

#include <gtest/gtest.h>

#include "meshflow/core/compare.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow::testing {

Tensor source_shard(const Layout& layout, DeviceId device, std::uint64_t seed) {
  const auto coords = coordinates(layout.mesh, device);
  std::uint64_t key = seed;
  for (std::size_t m = 0; m < coords.size(); ++m) {
    key = key * 31 + (layout.placements[m].is_replicate() ? 0 : coords[m] + 1);
  }
  return random_tensor(layout.dtype, local_shape(layout, device), key);
}

bool forbidden(const Layout& from, const Layout& to) {
  if (!(from.mesh == to.mesh)) return false;
  for (std::size_t m = 0; m < from.placements.size(); ++m) {
    const Placement& a = from.placements[m];
    const Placement& b = to.placements[m];
    if (a.is_shard() && b.is_partial()) return true;
    if (a.is_partial() && b.is_partial() && a.op != b.op) return true;
  }
  return false;
}

namespace {

bool sums(const Layout& l) {
  for (const Placement& p : l.placements) {
    if (p.is_partial() && (p.op == ReduceOp::kSum || p.op == ReduceOp::kAvg)) return true;
  }
  return false;
}

}  // namespace

int check_pairs(Communicator& world, const std::vector<std::pair<Layout, Layout>>& pairs,
                PlanCache& cache, std::uint64_t seed) {
  const DeviceId me = world.device();
  int checked = 0;
  for (const auto& [from, to] : pairs) {
    const std::string what = fmt::format("seed {}: {} -> {}", seed, to_string(from), to_string(to));
    std::shared_ptr<const Plan> plan;
    try {
      plan = cache.get(from, to);
    } catch (const Error& e) {
      if (me == 0) {
        EXPECT_TRUE(forbidden(from, to)) << what << ": unexpected error " << e.what();
      }
      continue;
    }
    if (me == 0) {
      EXPECT_FALSE(forbidden(from, to)) << what << ": planned a forbidden redistribution";
    }
    const bool in_from = find_device(from.mesh, me).has_value();
    Tensor local = in_from ? source_shard(from, me, seed) : Tensor(from.dtype, {0});
    Tensor result = execute(*cache.program(from, to, me), world, local);
    // Gather every destination shard to every device.
    std::vector<std::int64_t> counts(world.size(), 0);
    for (DeviceId d : to.mesh.devices) counts[d] = numel(local_shape(to, d));
    const auto displ = displacements(counts);
    Tensor all = Tensor::uninitialized(to.dtype, {displ.back()});
    all_gather(
        world,
        {.send = result.bytes(), .recv = all.bytes(), .recv_counts = counts, .dtype = to.dtype});
    ++checked;
    if (me != 0) continue;
    std::vector<Tensor> dst, src;
    for (DeviceId d : to.mesh.devices) {
      Tensor t = Tensor::uninitialized(to.dtype, local_shape(to, d));
      std::memcpy(t.bytes(), all.bytes() + displ[d] * size_of(to.dtype), t.nbytes());
      dst.push_back(std::move(t));
    }
    for (DeviceId d : from.mesh.devices) src.push_back(source_shard(from, d, seed));
    try {
      Tensor want = assemble(from, src);
      Tensor got = assemble(to, dst);
      const bool tolerant = is_floating(from.dtype) && (sums(from) || sums(to));
      auto diff = tolerant ? compare_close(got, want, 1e-5, 1e-5) : compare_exact(got, want);
      EXPECT_EQ(diff, std::nullopt) << what << " via " << plan->planner << "\n" << to_text(*plan);
    } catch (const Error& e) {
      ADD_FAILURE() << what << " via " << plan->planner << ": " << e.what() << "\n"
                    << to_text(*plan);
    }
  }
  return checked;
}

std::vector<std::pair<Layout, Layout>> all_pairs(const DeviceMesh& mesh, const Shape& shape,
                                                 DType dtype) {
  const std::vector<Placement> options = {Placement::replicate(),
                                          Placement::shard(0),
                                          Placement::shard(1),
                                          Placement::partial(ReduceOp::kSum),
                                          Placement::partial(ReduceOp::kAvg),
                                          Placement::partial(ReduceOp::kMax)};
  std::vector<std::vector<Placement>> lists{{}};
  for (int m = 0; m < ndim(mesh); ++m) {
    std::vector<std::vector<Placement>> next;
    for (const auto& l : lists) {
      for (const Placement& p : options) {
        // Integer Partial(avg) is not a layout (make_layout refuses it).
        if (p.is_partial() && p.op == ReduceOp::kAvg && !is_floating(dtype)) continue;
        auto v = l;
        v.push_back(p);
        next.push_back(v);
      }
    }
    lists = next;
  }
  std::vector<std::pair<Layout, Layout>> pairs;
  for (const auto& a : lists) {
    for (const auto& b : lists)
      pairs.emplace_back(make_layout(mesh, a, shape, dtype), make_layout(mesh, b, shape, dtype));
  }
  return pairs;
}

std::vector<std::pair<Layout, Layout>> large_mesh_pairs() {
  auto L = [](const char* placements, Shape shape) {
    return make_layout(parse_mesh("2x2x2x2"), parse_placements(placements), std::move(shape),
                       DType::kFloat32);
  };
  return {
      {L("S(0),P(sum),R,S(1)", {8, 8, 4}), L("R,S(1),S(0),R", {8, 8, 4})},
      {L("S(0),S(1),R,R", {8, 8}), L("R,R,S(1),S(0)", {8, 8})},
      {L("P(sum),R,R,S(0)", {8, 8}), L("S(0),S(1),P(sum),R", {8, 8})},
      {L("S(0),P(sum),R,S(1)", {7, 5, 3}), L("R,S(1),S(0),R", {7, 5, 3})},
  };
}

}  // namespace meshflow::testing
