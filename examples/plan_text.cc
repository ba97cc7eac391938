// A plan as text and as JSON: what `meshflow plan` prints, from C++.
#include <cstdio>

#include "meshflow/plan/planner.h"

int main() {
  using namespace meshflow;
  const DeviceMesh mesh = parse_mesh("2x2x2");
  const Layout from = make_layout(mesh, parse_placements("P(sum),R,P(sum)"), {16, 16, 16});
  const Layout to = make_layout(mesh, parse_placements("R,R,R"), {16, 16, 16});
  const Plan plan = plan_redistribute(from, to);
  std::printf("%s\n%s\n", to_text(plan).c_str(), to_json(plan).dump(2).c_str());
  return plan.steps.size() == 1 ? 0 : 1;
}
