// The `meshflow` subcommands. Each add_* registers its options on `app` and sets the callback
// that runs it; the callbacks parse values, call the library and print. No logic of their own.
#pragma once

#include <CLI/CLI.hpp>

namespace meshflow::cli {

void add_shard(CLI::App& app);
void add_gather(CLI::App& app);
void add_bench(CLI::App& app);
void add_plan(CLI::App& app);
void add_redistribute(CLI::App& app);
void add_run(CLI::App& app);
void add_train(CLI::App& app);
void add_explain(CLI::App& app);

}  // namespace meshflow::cli
