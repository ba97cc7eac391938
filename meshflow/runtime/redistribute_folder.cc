// Folder redistribution over either backend.
#include "meshflow/runtime/redistribute_folder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

RedistributeFolderResult redistribute_folder(const RedistributeFolderOptions& options) {
  const Layout from = read_layout(options.in);
  const Layout to =
      make_layout(options.to_mesh.value_or(from.mesh), options.to, from.shape, from.dtype);
  RedistributeFolderResult result{.plan = plan_redistribute(from, to, options.plan)};
  DeviceId last = 0;
  for (DeviceId d : from.mesh.devices) last = std::max(last, d);
  for (DeviceId d : to.mesh.devices) last = std::max(last, d);
  const DeviceId leader = to.mesh.devices.front();
  std::mutex mu;
  std::filesystem::path staged;
  auto run = [&](Communicator& world) {
    const DeviceId me = world.device();
    // Every device agrees on the staging folder, named after the leader's process.
    std::int64_t pid = ::getpid();
    broadcast(world, {.data = reinterpret_cast<std::byte*>(&pid),
                      .count = 1,
                      .dtype = DType::kInt64,
                      .root = leader});
    const std::string tag = fmt::format(".tmp-{}", pid);
    const std::filesystem::path tmp = options.out.string() + tag;
    if (me == leader) {
      std::lock_guard lock(mu);
      staged = stage_folder(options.out, tag);
    }
    barrier(world);
    const auto from_index = find_device(from.mesh, me);
    const auto to_index = find_device(to.mesh, me);
    Tensor local = from_index ? read_shard(options.in, from, *from_index) : Tensor(from.dtype, {0});
    barrier(world);
    const auto start = std::chrono::steady_clock::now();
    Tensor out = execute_plan(result.plan, world, local);
    barrier(world);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (to_index) write_npy(tmp / shard_file_name(*to_index), out);
    if (me == leader) {
      write_file_atomic(tmp / "layout.json", layout_to_json(to).dump(2) + "\n");
      std::lock_guard lock(mu);
      result.seconds = seconds;
      result.reporter = true;
    }
    barrier(world);
    if (me == leader) commit_folder(tmp, options.out);
  };
  try {
    launch({.backend = options.backend, .devices = last + 1, .timeout = options.timeout}, run);
  } catch (...) {
    if (!staged.empty()) discard_folder(staged);
    throw;
  }
  return result;
}

}  // namespace meshflow
