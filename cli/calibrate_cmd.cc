// `meshflow calibrate [--backend threads|mpi] [--devices N] [--out machine.json] [--reps R]`:
// measures this machine with N devices running at once and writes the machine description
// `--machine` takes (explain, train, bench overlap --simulate, bench train).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "meshflow/auto/calibrate.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"

namespace meshflow::cli {

void add_calibrate(CLI::App& app) {
  struct Args {
    std::string backend, out = "machine.json";
    std::optional<int> devices;
    int reps = 5;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure this machine with N devices running at once (GEMM and kernel rates, memcpy, each "
      "collective's latency and bandwidth, the device hand-off) and write the machine "
      "description --machine takes");
  cmd->add_option("--backend", args->backend,
                  "threads or mpi (default: mpi under mpirun, else threads)");
  cmd->add_option("--devices", args->devices,
                  "devices running at once (threads: device threads, default 4; mpi: devices of "
                  "the world, default all)")
      ->check(CLI::Range(1, kMaxThreadDevices));
  cmd->add_option("--out", args->out, "the machine description to write")->capture_default_str();
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
    const std::filesystem::path folder = std::filesystem::path(args->out).parent_path();
    if (!folder.empty() && !std::filesystem::is_directory(folder)) {
      fail(ErrorKind::kIo, "--out {}: the folder {} does not exist", args->out, folder.string());
    }
    const auto start = std::chrono::steady_clock::now();
    const CalibrateOptions options{
        .backend = backend,
        .devices = args->devices.value_or(backend == Backend::kThreads ? 4 : 0),
        .reps = args->reps,
        .progress =
            args->quiet ? std::function<void(const std::string&)>() : [](const std::string& line) {
              fmt::print(stderr, "calibrate: {}\n", line);
              std::fflush(stderr);
            }};
    const MachineModel machine = calibrate(options);
    if (!prints_shared_errors()) return;  // mpi: world rank 0 writes for the job
    write_file_atomic(args->out, machine_to_json(machine).dump(2) + "\n");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("wrote {} ({:.1f} s)\n", args->out, seconds);
  });
}

}  // namespace meshflow::cli
