// Folder redistribution over either backend. Order of work on every device: agree on what to
// run (under mpi, before any collective), stage the output (the leader), read its own shard,
// check the replica rule across devices (one all-gather of shard hashes), run the plan, write its
// new shard, and publish the folder (the leader) once every device has written.
#include "meshflow/runtime/redistribute_folder.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

namespace {

struct Prepared {
  Layout from, to;
  Plan plan;
  std::vector<DeviceId> devices;  // every device of either mesh, ascending
};

Prepared prepare(const RedistributeFolderOptions& options) {
  Layout from = read_layout(options.in);
  Layout to = make_layout(options.to_mesh.value_or(from.mesh), options.to, from.shape, from.dtype);
  Plan plan = plan_redistribute(from, to, options.plan);
  std::vector<DeviceId> devices = plan_devices(plan);
  return Prepared{std::move(from), std::move(to), std::move(plan), std::move(devices)};
}

// Fails on the first device (in `mesh` order) whose shard hash differs from its replica
// reference's; the other devices go on and fail in their next collective.
void check_replica_hashes(Communicator& world, const Layout& from, const Tensor& local) {
  const DeviceId me = world.device();
  std::int64_t mine = 0;
  if (find_device(from.mesh, me)) {
    mine = static_cast<std::int64_t>(std::hash<std::string_view>{}(std::string_view(
        reinterpret_cast<const char*>(local.bytes()), static_cast<std::size_t>(local.nbytes()))));
  }
  std::vector<std::int64_t> hashes(world.devices().size());
  all_gather(world, {.send = reinterpret_cast<const std::byte*>(&mine),
                     .recv = reinterpret_cast<std::byte*>(hashes.data()),
                     .recv_counts = std::vector<std::int64_t>(hashes.size(), 1),
                     .dtype = DType::kInt64});
  std::unordered_map<DeviceId, std::int64_t> hash_of;
  for (std::size_t r = 0; r < hashes.size(); ++r) hash_of[world.devices()[r]] = hashes[r];
  for (DeviceId d : from.mesh.devices) {
    const auto reference = replica_reference(from, d);
    if (!reference) continue;
    if (hash_of.at(d) == hash_of.at(*reference)) continue;
    if (d == me) fail_replicas_disagree(from, d);
    return;
  }
}

}  // namespace

RedistributeFolderResult redistribute_folder(const RedistributeFolderOptions& options) {
  std::optional<Prepared> prepared;
  LaunchOptions launch_options{.backend = options.backend, .timeout = options.timeout};
  try {
    prepared = prepare(options);
    launch_options.devices = prepared->devices;
    // Under mpi device 0 reports (DESIGN: only device 0 prints), so it takes part.
    auto& d = launch_options.devices;
    if (options.backend == Backend::kMpi && std::find(d.begin(), d.end(), 0) == d.end())
      d.insert(d.begin(), DeviceId{0});
    launch_options.agreement = {{"the source folder", options.in.string()},
                                {"the output folder", options.out.string()},
                                {"the plan", to_text(prepared->plan)}};
  } catch (const Error& e) {
    // Under mpi every rank must learn of a rank's failure, or the others would wait for it.
    if (options.backend != Backend::kMpi) throw;
    launch_options.agreement = {{"preparation", fmt::format("error: {}", e.what())}};
  }
  RedistributeFolderResult result;
  if (prepared) result.plan = prepared->plan;
  std::mutex mu;
  std::filesystem::path staged;
  // Runs only once every device agreed that preparation succeeded everywhere.
  auto run = [&](Communicator& world) {
    const Layout& from = prepared->from;
    const Layout& to = prepared->to;
    const DeviceId leader = to.mesh.devices.front();
    const DeviceId me = world.device();
    std::string path;
    if (me == leader) {
      path = stage_folder(options.out).string();
      std::lock_guard lock(mu);
      staged = path;
    }
    const std::filesystem::path tmp = broadcast_string(world, path, rank_of(world, leader));
    const auto from_index = find_device(from.mesh, me);
    const auto to_index = find_device(to.mesh, me);
    Tensor local = from_index ? read_shard(options.in, from, *from_index) : Tensor(from.dtype, {0});
    check_replica_hashes(world, from, local);
    barrier(world);
    if (me == leader && options.progress) options.progress("read the source shards");
    const auto start = std::chrono::steady_clock::now();
    Tensor out = execute(lower(result.plan, me), world, local);
    barrier(world);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (me == leader && options.progress) options.progress("moved the data");
    if (to_index) write_npy(tmp / shard_file_name(*to_index), out);
    if (me == leader) write_file_atomic(tmp / "layout.json", layout_to_json(to).dump(2) + "\n");
    if (me == (options.backend == Backend::kMpi ? DeviceId{0} : leader)) {
      std::lock_guard lock(mu);
      result.seconds = seconds;
      result.reporter = true;
    }
    barrier(world);
    if (me == leader) {
      commit_folder(tmp, options.out);
      if (options.progress) options.progress("wrote the new shards");
    }
  };
  try {
    launch(launch_options, run);
  } catch (...) {
    if (!staged.empty()) discard(staged);
    throw;
  }
  return result;
}

}  // namespace meshflow
