// Streaming between one .npy file and a sharded folder, for `meshflow shard` and `meshflow
// gather`: data moves in slabs of at most kIoSlabBytes with positioned reads and writes, so
// memory stays bounded whatever the tensor's size and every byte is read once from where it
// lives and written once to where it goes. Outputs follow the atomic protocol of core/file.h.
#pragma once

#include <filesystem>
#include <functional>
#include <vector>

#include "meshflow/mesh/layout.h"

namespace meshflow {

// The most bytes a slab of either stream holds.
inline constexpr std::int64_t kIoSlabBytes = std::int64_t{8} << 20;

// Called after each slab with the bytes of the global tensor done so far and in all.
using Progress = std::function<void(std::int64_t done, std::int64_t total)>;

// Splits the .npy array at `input` over `mesh` by `placements` (Shard and Replicate only) into
// the sharded folder `out`; returns its layout. Throws Error naming the file or value at fault.
Layout shard_file(const std::filesystem::path& input, const DeviceMesh& mesh,
                  const std::vector<Placement>& placements, const std::filesystem::path& out,
                  const Progress& progress = nullptr);

// Assembles the sharded folder `in` into the .npy file `out`, reducing Partial terms and
// checking every replica (the replica rule of mesh/sharding.h); returns the folder's layout.
Layout gather_file(const std::filesystem::path& in, const std::filesystem::path& out,
                   const Progress& progress = nullptr);

}  // namespace meshflow
