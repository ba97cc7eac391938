// libFuzzer harness: the machine description `--machine FILE.json` loads, then one plan priced
// with it. Any input must end in a model or a meshflow::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "meshflow/core/error.h"
#include "meshflow/core/json_field.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshflow::MachineModel model =
        meshflow::machine_from_json(meshflow::parse_json(text, "machine.json"), "machine.json");
    const meshflow::Layout from = meshflow::make_layout(
        meshflow::make_mesh({2, 2}), meshflow::parse_placements("S(0),P(sum)"), {8, 8});
    const meshflow::Layout to = meshflow::make_layout(meshflow::make_mesh({2, 2}),
                                                      meshflow::parse_placements("R,S(1)"), {8, 8});
    (void)meshflow::plan_redistribute(from, to, {.machine = &model});
  } catch (const meshflow::Error&) {
  }
  return 0;
}
