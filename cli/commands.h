// The `meshflow` subcommands. Each add_* registers its options on `app` and sets the callback
// that runs it; the callbacks parse values, call the library and print. No logic of their own.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "meshflow/comm/backend.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::cli {

// The most threads a device (--threads-per-device) or a bench (--threads) may ask for.
constexpr int kMostThreads = 1 << 12;

// Returns the machine model named by --machine (the default when empty). The model must
// outlive the plan options that point at it.
std::shared_ptr<MachineModel> machine_option(const std::string& path);

// Returns the backend --backend names, or where it is empty the one the process was started for
// (mpi under mpirun, else threads).
Backend backend_option(const std::string& name);

void add_shard(CLI::App& app);
void add_gather(CLI::App& app);
void add_bench(CLI::App& app);
void add_plan(CLI::App& app);
void add_redistribute(CLI::App& app);
void add_run(CLI::App& app);
void add_train(CLI::App& app);
void add_explain(CLI::App& app);
void add_checkpoint(CLI::App& app);
void add_autoshard(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_data(CLI::App& app);
void add_generate(CLI::App& app);
void add_launch(CLI::App& app);

}  // namespace meshflow::cli
