// `meshflow bench NAME`: runs a benchmark and prints its table, or its JSON with --json.
#include <fmt/format.h>

#include "bench/copy_bench.h"
#include "cli/commands.h"

namespace meshflow::cli {

namespace {

void print_report(const bench::BenchReport& report, bool json) {
  if (json) {
    fmt::print("{}\n", bench::to_json(report).dump(2));
  } else {
    fmt::print("{}", bench::to_table(report));
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Run a benchmark; prints a table, or JSON with --json");
  bench->require_subcommand(1);

  auto copy = std::make_shared<bench::CopyBenchOptions>();
  auto copy_json = std::make_shared<bool>(false);
  CLI::App* c = bench->add_subcommand("copy", "copy_box of a large region against plain memcpy");
  c->add_option("--mib", copy->region_mib, "region size in MiB")->check(CLI::PositiveNumber);
  c->add_option("--reps", copy->reps, "timed repetitions")->check(CLI::PositiveNumber);
  c->add_flag("--json", *copy_json, "print JSON");
  c->callback([copy, copy_json] { print_report(bench::run_copy_bench(*copy), *copy_json); });
}

}  // namespace meshflow::cli
