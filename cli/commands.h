// The `meshflow` subcommands. Each add_* registers its options on `app` and sets the callback
// that runs it; the callbacks parse values, call the library and print. No logic of their own.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "meshflow/auto/machine_cache.h"
#include "meshflow/comm/backend.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::cli {

// The most threads a device (--threads-per-device) or a bench (--threads) may ask for.
constexpr int kMostThreads = 1 << 12;

// What a command given no --machine does with this machine's measured description
// (auto/machine_cache.h): estimates (explain, autoshard, train --auto, the benches) measure it
// where the cache holds none; runs and plans use it where the cache holds it, else the built-in
// one, so that a run never waits for a measurement; `redistribute`, whose devices are known
// only once its folder is read, takes the built-in one. Outside mpirun an mpi description is
// read where cached and never measured (only mpi's processes can measure it).
enum class MachineUse { kMeasure, kCached, kBuiltIn };

// Returns the description --machine names ("default": the built-in one; a file), or, where it is
// empty, this machine's for `devices` devices with `threads_per_device` threads each (0: the
// default) on `backend`, as `use` says, with its lines on standard error. The description must
// outlive the plan options that point at it.
std::shared_ptr<const ChosenMachine> machine_option(const std::string& text, MachineUse use,
                                                    Backend backend, int devices,
                                                    int threads_per_device = 0);

// Returns --machine's help for a command that uses the measured description as `use` says.
std::string machine_help(MachineUse use);

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
