// `meshflow calibrate [--backend threads|mpi] [--devices N] [--threads-per-device T]
// [--out machine.json] [--reps R]`: measures this machine with N devices running at once and
// writes the machine description `--machine` takes, or, without --out, refreshes this machine's
// cached description (auto/machine_cache.h) that every estimate uses where no --machine is given.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "meshflow/auto/calibrate.h"
#include "meshflow/auto/machine_cache.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"

namespace meshflow::cli {

void add_calibrate(CLI::App& app) {
  struct Args {
    std::string backend, out;
    std::optional<int> devices;
    int threads_per_device = 0;  // 0: the default
    int reps = 5;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure this machine with N devices running at once (GEMM and kernel rates, memcpy, each "
      "collective's latency and bandwidth, the device hand-off) and write the machine "
      "description --machine takes, or refresh the one every estimate uses where no --machine "
      "is given");
  cmd->add_option("--backend", args->backend,
                  "threads or mpi (default: mpi under mpirun, else threads)");
  cmd->add_option("--devices", args->devices,
                  "devices running at once (threads: device threads, default 4; mpi: devices of "
                  "the world, default all)")
      ->check(CLI::Range(1, kMaxThreadDevices));
  cmd->add_option("--threads-per-device", args->threads_per_device,
                  "threads each device computes with (default: this machine's cores divided by "
                  "the devices, at least 1)")
      ->check(CLI::Range(1, kMostThreads));
  cmd->add_option("--out", args->out,
                  "write the description here (default: refresh this machine's cached one, in "
                  "$XDG_CACHE_HOME/meshflow or ~/.cache/meshflow, for these devices and threads; "
                  "without --devices, every one cached for this machine and backend, else 4 "
                  "devices)");
  cmd->add_option("--reps", args->reps, "timed repetitions per measurement (the median counts)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--quiet", args->quiet, "no progress lines");
  cmd->callback([args] {
    const Backend backend = backend_option(args->backend);
    if (backend == Backend::kMpi && detect_backend() != Backend::kMpi) {
      fail(ErrorKind::kInvalidArgument,
           "--backend mpi needs mpirun: start it as `mpirun -n 4 meshflow calibrate --backend "
           "mpi` (as root, add --allow-run-as-root)");
    }
    const auto start = std::chrono::steady_clock::now();
    auto say = [](const std::string& line) {
      fmt::print(stderr, "calibrate: {}\n", line);
      std::fflush(stderr);
    };
    const std::function<void(const std::string&)> progress =
        args->quiet ? std::function<void(const std::string&)>() : say;
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if (args->out.empty()) {
      // The cache: the keys asked for, or every one this machine has for the backend.
      const std::filesystem::path folder = machine_cache_folder();
      std::vector<MachineKey> keys;
      if (!args->devices) keys = cached_keys(folder, backend);
      if (keys.empty()) {
        int devices = 4;
        if (args->devices) {
          devices = *args->devices;
        } else if (backend == Backend::kMpi) {
          launch({.backend = backend}, [&](Communicator& world) { devices = world.size(); });
        }
        keys.push_back(machine_key(backend, devices, args->threads_per_device));
      }
      for (const MachineKey& key : keys) {
        cached_machine(key,
                       {.folder = folder, .refresh = true, .note = progress, .progress = progress});
        if (prints_shared_errors())
          fmt::print("wrote {} ({})\n", machine_cache_file(key, folder).string(), to_string(key));
      }
      if (prints_shared_errors()) fmt::print("({:.1f} s)\n", elapsed());
      return;
    }
    const std::filesystem::path folder = std::filesystem::path(args->out).parent_path();
    if (!folder.empty() && !std::filesystem::is_directory(folder)) {
      fail(ErrorKind::kIo, "--out {}: the folder {} does not exist", args->out, folder.string());
    }
    const CalibrateOptions options{
        .backend = backend,
        .devices = args->devices.value_or(backend == Backend::kThreads ? 4 : 0),
        .threads_per_device = args->threads_per_device,
        .reps = args->reps,
        .progress = progress};
    const MachineModel machine = calibrate(options);
    if (!prints_shared_errors()) return;  // mpi: world rank 0 writes for the job
    write_file_atomic(args->out, machine_to_json(machine).dump(2) + "\n");
    fmt::print("wrote {} ({:.1f} s)\n", args->out, elapsed());
  });
}

}  // namespace meshflow::cli
