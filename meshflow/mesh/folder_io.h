// Streaming between one .npy file and a sharded folder, for `meshflow shard` and `meshflow
// gather`: data moves in slabs of at most kIoSlabBytes with positioned reads and writes, so
// memory stays bounded whatever the tensor's size and every byte is read once from where it
// lives and written once to where it goes. Outputs follow the atomic protocol of core/file.h.
#pragma once

#include <filesystem>
#include <functional>
#include <vector>

#include "meshflow/core/tensor.h"
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
// checking every replica present (the replica rule of mesh/sharding.h; a replica's file may be
// absent, as in a checkpoint, which writes one copy per replica group); returns the folder's
// layout.
Layout gather_file(const std::filesystem::path& in, const std::filesystem::path& out,
                   const Progress& progress = nullptr);

// Returns box `box` of the global tensor stored in sharded folder `dir` of layout `layout`
// (Shard and Replicate only), read from the representative devices' files (mesh/sharding.h;
// a replica's file may be absent): from each file only the part of `box` it holds, with one
// positioned read per run contiguous in that file. What a device needs of a folder saved on
// another mesh (checkpoint resume, model sources). Throws Error(kIo) naming a file that is
// missing or does not hold its shard.
Tensor read_folder_box(const std::filesystem::path& dir, const Layout& layout, const Box& box);

}  // namespace meshflow
