// libFuzzer harness: .npy files (header and data) as read_npy parses them from memory. Any input
// must end in a tensor or a meshflow::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)meshflow::parse_npy(bytes, "x.npy");
  } catch (const meshflow::Error&) {
  }
  return 0;
}
