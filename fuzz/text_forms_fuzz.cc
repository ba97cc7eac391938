// libFuzzer harness: the text forms users type (a mesh "2x2@4,5,6,7", placements "S(0),R", a
// shape "16x16"). The input is split at '|' into the three; whatever parses is combined into a
// layout and planned against all-Replicate, so the values flow on into planning.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "meshflow/core/error.h"
#include "meshflow/mesh/layout.h"
#include "meshflow/plan/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t a = text.find('|');
  const std::size_t b = a == std::string_view::npos ? a : text.find('|', a + 1);
  const std::string_view mesh_text = text.substr(0, a);
  const std::string_view placements_text =
      a == std::string_view::npos ? std::string_view() : text.substr(a + 1, b - a - 1);
  const std::string_view shape_text =
      b == std::string_view::npos ? std::string_view() : text.substr(b + 1);
  try {
    const meshflow::DeviceMesh mesh = meshflow::parse_mesh(mesh_text);
    const auto placements = meshflow::parse_placements(placements_text);
    const meshflow::Shape shape = meshflow::parse_shape(shape_text);
    const meshflow::Layout from = meshflow::make_layout(mesh, placements, shape);
    // Planning is only asked of small meshes: a fuzzer's minutes are better spent on parsing.
    if (meshflow::size(mesh) > 64) return 0;
    const meshflow::Layout to = meshflow::make_layout(
        mesh, std::vector<meshflow::Placement>(placements.size(), meshflow::Placement::replicate()),
        shape);
    (void)meshflow::plan_redistribute(from, to);
  } catch (const meshflow::Error&) {
  }
  return 0;
}
