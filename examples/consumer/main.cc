// A program that uses meshflow as a library: shard a tensor over a 2x2 mesh of threads,
// redistribute it to other placements, gather it back and check it. Built against an installed
// meshflow (find_package(meshflow) or pkg-config meshflow), or inside meshflow's own build.
#include <cstdio>
#include <vector>

#include "meshflow/comm/launch.h"
#include "meshflow/core/compare.h"
#include "meshflow/core/random.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/plan/lower.h"
#include "meshflow/plan/planner.h"
#include "meshflow/runtime/executor.h"

int main() {
  using namespace meshflow;
  const Tensor x = random_tensor(DType::kFloat32, {13, 6}, /*seed=*/7);
  const DeviceMesh mesh = parse_mesh("2x2");
  const Layout from = make_layout(mesh, parse_placements("S(0),S(1)"), x.shape());
  const Layout to = make_layout(mesh, parse_placements("R,S(0)"), x.shape());
  const std::vector<Tensor> shards = shard_tensor(x, from);
  const Plan plan = plan_redistribute(from, to);
  std::vector<Tensor> moved(shards.size());
  launch({.backend = Backend::kThreads, .devices = mesh.devices}, [&](Communicator& world) {
    const int i = *find_device(mesh, world.device());
    moved[i] = execute(lower(plan, world.device()), world, shards[i]);
  });
  if (auto diff = compare_exact(assemble(to, moved), x)) {
    std::fprintf(stderr, "consumer: the gathered tensor differs: %s\n", diff->c_str());
    return 1;
  }
  std::printf("consumer: %s -> %s over %s by %s: ok\n", to_string(from.placements).c_str(),
              to_string(to.placements).c_str(), to_string(mesh).c_str(), plan.planner.c_str());
  return 0;
}
