// libFuzzer harness: layout.json, as every command that reads a sharded folder parses it. Any
// input must end in a layout or a meshflow::Error, never a crash, a sanitizer report or a hang.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "meshflow/core/error.h"
#include "meshflow/core/json_field.h"
#include "meshflow/mesh/sharded_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshflow::Layout layout =
        meshflow::layout_from_json(meshflow::parse_json(text, "layout.json"), "layout.json");
    // A layout that parses must be usable: every device's shard box lies inside the tensor.
    for (meshflow::DeviceId d : layout.mesh.devices) (void)meshflow::shard_box(layout, d);
  } catch (const meshflow::Error&) {
  }
  return 0;
}
