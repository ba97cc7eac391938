// Entry point of the `meshflow` command: every error becomes one line on standard error and a
// non-zero exit status (meshflow::exit_status; 2 for usage errors). Under mpirun only device 0
// (world rank 0) prints: every other rank's standard output is discarded here, once for every
// command, and an error every rank hits is printed by rank 0 alone.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "cli/commands.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/kernels/gemm.h"

int main(int argc, char** argv) {
  // OpenBLAS loaded its SSE3 fallback on a CPU model it does not know (kernels/gemm.h): start
  // again, once, with the kernels of this CPU's vector unit (if exec fails, go on as loaded).
  if (const std::optional<std::string> core = meshflow::blas_core_to_restart_with()) {
    ::setenv("OPENBLAS_CORETYPE", core->c_str(), 1);
    ::execv("/proc/self/exe", argv);
  }
  CLI::App app{
      "meshflow: tensors spread over device meshes (shard, gather, redistribute, run, train, "
      "explain, bench)"};
  app.set_version_flag("--version", "meshflow " MESHFLOW_VERSION);
  app.require_subcommand(1);
  meshflow::cli::add_shard(app);
  meshflow::cli::add_gather(app);
  meshflow::cli::add_plan(app);
  meshflow::cli::add_redistribute(app);
  meshflow::cli::add_run(app);
  meshflow::cli::add_train(app);
  meshflow::cli::add_explain(app);
  meshflow::cli::add_checkpoint(app);
  meshflow::cli::add_calibrate(app);
  meshflow::cli::add_autoshard(app);
  meshflow::cli::add_data(app);
  meshflow::cli::add_generate(app);
  meshflow::cli::add_launch(app);
  meshflow::cli::add_bench(app);
  auto known = [&app](const std::string& name) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(name)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    fmt::print(stderr, "meshflow: unknown command \"{}\" (see meshflow --help)\n", argv[1]);
    return 2;
  }
  // A command that launches devices reports from device 0; one that does not (explain, plan, a
  // bench on threads) runs alike on every rank: either way, one copy of the output.
  if (meshflow::detect_backend() == meshflow::Backend::kMpi && !meshflow::prints_shared_errors())
      [[maybe_unused]]
    std::FILE* silenced = std::freopen("/dev/null", "w", stdout);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "meshflow: {} (see meshflow --help)\n", e.what());
    return 2;
  } catch (const meshflow::Error& e) {
    // An error every device of an mpi job holds is printed once, by device 0.
    if (e.scope() == meshflow::ErrorScope::kThisDevice || meshflow::prints_shared_errors())
      fmt::print(stderr, "meshflow: error: {}\n", e.what());
    return meshflow::exit_status(e.kind());
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshflow: error: {}\n", e.what());
    return 3;
  }
  return 0;
}
