// Moving a tensor from one mesh onto another set of devices (a 2-device mesh onto a 2x2 mesh of
// four other devices), with the plan printed before the data moves.
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
  const Tensor x = random_tensor(DType::kFloat64, {9, 5}, /*seed=*/3);
  const Layout from =
      make_layout(parse_mesh("2@0,1"), parse_placements("S(0)"), x.shape(), DType::kFloat64);
  const Layout to = make_layout(parse_mesh("2x2@2,3,4,5"), parse_placements("S(1),R"), x.shape(),
                                DType::kFloat64);
  const Plan plan = plan_redistribute(from, to);
  std::printf("%s", to_text(plan).c_str());
  const std::vector<Tensor> shards = shard_tensor(x, from);
  std::vector<Tensor> moved(4);
  launch({.devices = plan_devices(plan)}, [&](Communicator& world) {
    const DeviceId me = world.device();
    const auto src = find_device(from.mesh, me);
    const Tensor nothing(DType::kFloat64, {0});  // devices 2..5 hold nothing before
    Tensor out = execute(lower(plan, me), world, src ? shards[*src] : nothing);
    if (auto dst = find_device(to.mesh, me)) moved[*dst] = std::move(out);
  });
  const bool same = !compare_exact(assemble(to, moved), x);
  std::printf("moved onto devices 2..5: %s\n", same ? "identical" : "DIFFERENT");
  return same ? 0 : 1;
}
