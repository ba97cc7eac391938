// `meshflow bench NAME`: runs a benchmark and prints its table, or its JSON with --json.
#include <fmt/format.h>

#include <optional>

#include "bench/collectives_bench.h"
#include "bench/copy_bench.h"
#include "bench/redistribute_bench.h"
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
  CLI::App* bench =
      app.add_subcommand("bench", "Run a benchmark; prints a table, or JSON with --json");
  bench->require_subcommand(1);

  auto copy = std::make_shared<bench::CopyBenchOptions>();
  auto copy_json = std::make_shared<bool>(false);
  CLI::App* c = bench->add_subcommand("copy", "copy_box of a large region against plain memcpy");
  c->add_option("--mib", copy->region_mib, "region size in MiB")->check(CLI::PositiveNumber);
  c->add_option("--reps", copy->reps, "timed repetitions")->check(CLI::PositiveNumber);
  c->add_flag("--json", *copy_json, "print JSON");
  c->callback([copy, copy_json] { print_report(bench::run_copy_bench(*copy), *copy_json); });

  struct CollArgs {
    std::string backend;
    std::optional<int> devices;
    std::vector<std::string> sizes{"16M", "256M"};
    std::vector<std::string> collectives;
    int reps = 7;
    bool json = false;
  };
  auto coll = std::make_shared<CollArgs>();
  CLI::App* k = bench->add_subcommand(
      "collectives", "every collective against its memcpy floor (threads) or raw MPI (mpi)");
  k->add_option("--backend", coll->backend,
                "threads or mpi (default: mpi under mpirun, else threads)");
  k->add_option("--devices", coll->devices,
                "device threads (threads, default 4); devices of the world (mpi, default all)");
  k->add_option("--sizes", coll->sizes, "global bytes per case, e.g. 4K,16M,256M")->delimiter(',');
  k->add_option("--collectives", coll->collectives, "subset, e.g. all_gather,all_reduce")
      ->delimiter(',');
  k->add_option("--reps", coll->reps, "timed repetitions")->check(CLI::PositiveNumber);
  k->add_flag("--json", coll->json, "print JSON");
  k->callback([coll] {
    bench::CollectivesBenchOptions o;
    o.backend = coll->backend.empty() ? detect_backend() : parse_backend(coll->backend);
    o.devices = coll->devices.value_or(o.backend == Backend::kThreads ? 4 : 0);
    for (const auto& s : coll->sizes) o.sizes.push_back(bench::parse_bytes(s));
    o.collectives = coll->collectives;
    o.reps = coll->reps;
    bool printer = false;
    bench::BenchReport report = bench::run_collectives_bench(o, &printer);
    if (printer) print_report(report, coll->json);
  });

  auto red = std::make_shared<CollArgs>();
  red->collectives.clear();
  CLI::App* rd = bench->add_subcommand(
      "redistribute",
      "S(0)->R, S(0)->S(1), P(sum)->S(0), P(sum)->R against memcpy floors; planning times");
  rd->add_option("--backend", red->backend,
                 "threads or mpi (default: mpi under mpirun, else threads)");
  rd->add_option("--devices", red->devices,
                 "device threads (threads, default 4); devices of the world (mpi, default all)");
  rd->add_option("--sizes", red->sizes, "global bytes per case, e.g. 16M,256M")->delimiter(',');
  rd->add_option("--cases", red->collectives, "subset, e.g. \"S(0)->R\"")->delimiter(',');
  rd->add_option("--reps", red->reps, "timed repetitions")->check(CLI::PositiveNumber);
  rd->add_flag("--json", red->json, "print JSON");
  rd->callback([red] {
    bench::RedistributeBenchOptions o;
    o.backend = red->backend.empty() ? detect_backend() : parse_backend(red->backend);
    o.devices = red->devices.value_or(o.backend == Backend::kThreads ? 4 : 0);
    for (const auto& s : red->sizes) o.sizes.push_back(bench::parse_bytes(s));
    o.cases = red->collectives;
    o.reps = red->reps;
    bool printer = false;
    bench::BenchReport report = bench::run_redistribute_bench(o, &printer);
    if (printer) print_report(report, red->json);
  });
}

}  // namespace meshflow::cli
