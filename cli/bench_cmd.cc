// `meshflow bench NAME`: runs a benchmark and prints its table, or its JSON with --json.
#include <fmt/format.h>

#include <functional>
#include <optional>

#include "bench/autoshard_bench.h"
#include "bench/checkpoint_bench.h"
#include "bench/collectives_bench.h"
#include "bench/copy_bench.h"
#include "bench/data_bench.h"
#include "bench/generate_bench.h"
#include "bench/io_bench.h"
#include "bench/kernels_bench.h"
#include "bench/ops_bench.h"
#include "bench/overlap_bench.h"
#include "bench/pipeline_bench.h"
#include "bench/plan_bench.h"
#include "bench/redistribute_bench.h"
#include "bench/train_bench.h"
#include "cli/commands.h"
#include "meshflow/comm/launch.h"

namespace meshflow::cli {

namespace {

void print_report(const bench::BenchReport& report, bool json) {
  if (json) {
    fmt::print("{}\n", bench::to_json(report).dump(2));
  } else {
    fmt::print("{}", bench::to_table(report));
  }
}

// Adds the flags every benchmark takes: --json (sets `json`) and --quiet (clears `progress`).
// Both variables must outlive the command's parsing (they live in its callback's options).
void add_output_flags(CLI::App* cmd, bool& json, bool& progress) {
  cmd->add_flag("--json", json, "print JSON");
  cmd->add_flag(
      "--quiet", [&progress](std::int64_t) { progress = false; }, "no progress lines");
}

// Returns false on every process but world rank 0 under mpirun: a benchmark of one process
// (copy, io, ops, train) runs there alone, since copies on the other ranks would compete for
// the memory and cores it measures (and only device 0 prints).
bool runs_here() { return prints_shared_errors(); }

// Returns the benches' descriptions (threads): --machine's, or this machine's measured one for
// each device count and threads per device, measured the first time.
std::function<ChosenMachine(int, int)> bench_machine(const std::string& text) {
  return [text](int devices, int threads_per_device) {
    return *machine_option(text, MachineUse::kMeasure, Backend::kThreads, devices,
                           threads_per_device);
  };
}

// What the distributed benchmarks (collectives, redistribute) take, parsed.
struct DistributedRun {
  Backend backend;
  int devices;
  std::vector<std::int64_t> sizes;
  std::vector<std::string> subset;
  int reps;
  bool progress;
};

// Registers `meshflow bench NAME` with the options both distributed benchmarks share; `run`
// returns the report and sets `printer` where it should be printed (device 0 under mpi).
CLI::App* add_distributed(CLI::App* bench, const char* name, const char* help,
                          const char* subset_flag, const char* subset_help,
                          std::function<bench::BenchReport(const DistributedRun&, bool*)> run) {
  struct Args {
    std::string backend;
    std::optional<int> devices;
    std::vector<std::string> sizes{"16M", "256M"};
    std::vector<std::string> subset;
    int reps = 7;
    bool json = false, progress = true;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand(name, help);
  cmd->add_option("--backend", args->backend,
                  "threads or mpi (default: mpi under mpirun, else threads)");
  cmd->add_option("--devices", args->devices,
                  "device threads (threads, default 4); devices of the world (mpi, default all)");
  cmd->add_option("--sizes", args->sizes, "global bytes per case, e.g. 4K,16M,256M")
      ->capture_default_str()
      ->delimiter(',');
  cmd->add_option(subset_flag, args->subset, subset_help)->delimiter(',');
  cmd->add_option("--reps", args->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  add_output_flags(cmd, args->json, args->progress);
  const std::string cmd_name = name;
  cmd->callback([args, run, cmd_name] {
    DistributedRun r{.backend = backend_option(args->backend),
                     .devices = 0,
                     .sizes = {},
                     .subset = args->subset,
                     .reps = args->reps,
                     .progress = args->progress};
    if (r.backend == Backend::kMpi && detect_backend() != Backend::kMpi) {
      fail(ErrorKind::kInvalidArgument,
           "--backend mpi needs mpirun: start it as `mpirun -n 4 meshflow bench {} --backend "
           "mpi` (as root, add --allow-run-as-root)",
           cmd_name);
    }
    r.devices = args->devices.value_or(r.backend == Backend::kThreads ? 4 : 0);
    for (const auto& size : args->sizes) r.sizes.push_back(bench::parse_bytes(size));
    bool printer = false;
    bench::BenchReport report = run(r, &printer);
    if (printer) print_report(report, args->json);
  });
  return cmd;
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Run a benchmark; prints a table, or JSON with --json");
  bench->require_subcommand(1);

  auto copy = std::make_shared<bench::CopyBenchOptions>();
  auto copy_json = std::make_shared<bool>(false);
  CLI::App* c = bench->add_subcommand("copy", "copy_box of a large region against plain memcpy");
  c->add_option("--mib", copy->region_mib, "region size in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_option("--reps", copy->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  add_output_flags(c, *copy_json, copy->progress);
  c->callback([copy, copy_json] {
    if (runs_here()) print_report(bench::run_copy_bench(*copy), *copy_json);
  });

  auto io = std::make_shared<bench::IoBenchOptions>();
  auto io_json = std::make_shared<bool>(false);
  auto io_mib = std::make_shared<std::int64_t>(512);
  CLI::App* i = bench->add_subcommand(
      "io", "meshflow shard and gather of one .npy file against NumPy, with peak memory");
  i->add_option("--mib", *io_mib, "tensor size in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  i->add_option("--reps", io->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  i->add_option("--dir", io->dir, "folder for the files (default: the temporary folder)");
  add_output_flags(i, *io_json, io->progress);
  i->callback([io, io_json, io_mib] {
    if (!runs_here()) return;
    io->bytes = *io_mib << 20;
    print_report(bench::run_io_bench(*io), *io_json);
  });

  auto data = std::make_shared<bench::DataBenchOptions>();
  auto data_json = std::make_shared<bool>(false);
  auto data_mib = std::make_shared<std::int64_t>(2048);
  CLI::App* d = bench->add_subcommand(
      "data", "one device's batch read from a large token stream, against memcpy of its bytes");
  d->add_option("--stream-mib", *data_mib, "the token stream's size in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  d->add_option("--batch", data->batch, "rows B of a step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  d->add_option("--seq", data->seq, "tokens S of a row")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  d->add_option("--reps", data->reps, "timed repetitions")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  d->add_option("--dir", data->dir, "folder for the stream (default: the temporary folder)");
  add_output_flags(d, *data_json, data->progress);
  d->callback([data, data_json, data_mib] {
    if (!runs_here()) return;
    data->stream_bytes = *data_mib << 20;
    print_report(bench::run_data_bench(*data), *data_json);
  });

  auto gen = std::make_shared<bench::GenerateBenchOptions>();
  auto gen_json = std::make_shared<bool>(false);
  CLI::App* gn = bench->add_subcommand(
      "generate",
      "decoding with the KV cache (1 and 8 samples) against memcpy of the bytes a step reads and "
      "a KV-cached PyTorch loop, --no-cache, and prefill against its products");
  gn->add_option("--reps", gen->reps, "timed repetitions")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  gn->add_option("--meshes", gen->meshes, "meshes: 1 (one device) and 2 (the tp layout)")
      ->check(CLI::IsMember({"1", "2"}))
      ->capture_default_str();
  gn->add_option("--prompt", gen->prompt, "decode: the prompt's tokens")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  gn->add_option("--new-tokens", gen->new_tokens, "decode: the new tokens per sample")
      ->check(CLI::Range(2, 1 << 16))
      ->capture_default_str();
  gn->add_option("--prefill-tokens", gen->prefill_tokens, "prefill: each prompt's tokens")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  gn->add_option("--gpt-seq", gen->gpt.seq, "the GPT's context")
      ->check(CLI::Range(2, 1 << 16))
      ->capture_default_str();
  gn->add_option("--gpt-width", gen->gpt.width, "the GPT's width (a multiple of --gpt-heads)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  gn->add_option("--gpt-heads", gen->gpt.heads, "the GPT's attention heads")
      ->check(CLI::Range(1, 1 << 10))
      ->capture_default_str();
  gn->add_option("--gpt-vocab", gen->gpt.vocab, "the GPT's vocabulary")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  gn->add_option("--gpt-blocks", gen->gpt.blocks, "the GPT's blocks")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  gn->add_option("--cases", gen->cases,
                 "only these cases: decode, decode_batch8, no_cache, prefill")
      ->check(CLI::IsMember({"decode", "decode_batch8", "no_cache", "prefill"}));
  gn->add_flag("!--no-pytorch", gen->pytorch, "skip the PyTorch baseline");
  add_output_flags(gn, *gen_json, gen->progress);
  gn->callback([gen, gen_json] {
    if (!runs_here()) return;
    print_report(bench::run_generate_bench(*gen), *gen_json);
  });

  auto pl = std::make_shared<bench::PlanBenchOptions>();
  auto pl_json = std::make_shared<bool>(false);
  CLI::App* p = bench->add_subcommand(
      "plan",
      "the planner's cold time for fixed layout pairs on meshes of 16, 4,096 and 65,536 devices, "
      "against the same pair on 16");
  p->add_option("--reps", pl->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  add_output_flags(p, *pl_json, pl->progress);
  p->callback([pl, pl_json] {
    if (runs_here()) print_report(bench::run_plan_bench(*pl), *pl_json);
  });

  auto pp = std::make_shared<bench::PipelineBenchOptions>();
  auto pp_json = std::make_shared<bool>(false);
  CLI::App* pipe = bench->add_subcommand(
      "pipeline",
      "two equal MLP stages, one device each, trained under gpipe, 1f1b and zb with 1-8 "
      "micro-batches: the measured bubble against theory and the step against the ideal one");
  pipe->add_option("--reps", pp->reps, "timed steps per case")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  pipe->add_option("--width", pp->width, "the layers' width")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  pipe->add_option("--batch", pp->batch, "the batch's rows (split into the micro-batches)")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  add_output_flags(pipe, *pp_json, pp->progress);
  pipe->callback([pp, pp_json] {
    if (runs_here()) print_report(bench::run_pipeline_bench(*pp), *pp_json);
  });

  auto as = std::make_shared<bench::AutoshardBenchOptions>();
  auto as_json = std::make_shared<bool>(false);
  auto as_machine = std::make_shared<std::string>();
  CLI::App* au = bench->add_subcommand(
      "autoshard",
      "the layout `meshflow autoshard` chooses for an MLP and the bench GPT on 2, 4 and 2x2 "
      "devices against at least 6 hand layouts each, all trained in the same run; the search "
      "time on a 12-block GPT and a 1,000-layer MLP");
  au->add_option("--reps", as->reps, "timed steps per layout")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  au->add_option("--meshes", as->meshes, "meshes to compare on")->delimiter(',');
  au->add_option("--models", as->models, "mlp, gpt")
      ->delimiter(',')
      ->check(CLI::IsMember({"mlp", "gpt"}));
  au->add_option("--batch", as->batch, "the MLP's batch")->capture_default_str();
  au->add_option("--width", as->in, "the MLP's width")->capture_default_str();
  au->add_option("--hidden", as->hidden, "the MLP's hidden width")->capture_default_str();
  au->add_option("--gpt-batch", as->gpt.batch, "the GPT's batch")->capture_default_str();
  au->add_option("--gpt-seq", as->gpt.seq, "the GPT's sequence")->capture_default_str();
  au->add_option("--gpt-width", as->gpt.width, "the GPT's width")->capture_default_str();
  au->add_option("--gpt-heads", as->gpt.heads, "the GPT's heads")->capture_default_str();
  au->add_option("--gpt-vocab", as->gpt.vocab, "the GPT's vocabulary")->capture_default_str();
  au->add_option("--machine", *as_machine, machine_help(MachineUse::kMeasure));
  au->add_flag("!--no-search", as->search_cases, "skip the search-time cases");
  add_output_flags(au, *as_json, as->progress);
  au->callback([as, as_json, as_machine] {
    if (!runs_here()) return;
    as->machine = bench_machine(*as_machine);
    print_report(bench::run_autoshard_bench(*as), *as_json);
  });

  auto ck = std::make_shared<bench::CheckpointBenchOptions>();
  auto ck_json = std::make_shared<bool>(false);
  auto ck_mib = std::make_shared<std::int64_t>(1024);
  CLI::App* k = bench->add_subcommand(
      "checkpoint",
      "train --checkpoint's save and --resume's load (onto another layout) of model and AdamW "
      "state on a 2x2 mesh, against plain I/O and sha256 of the same bytes and NumPy");
  k->add_option("--mib", *ck_mib, "state size in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  k->add_option("--reps", ck->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  k->add_option("--dir", ck->dir, "folder for the files (default: the temporary folder)");
  k->add_option("--train-steps", ck->train_steps,
                "train_ckpt_every_step: steps per run (below 2: the case does not run)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  add_output_flags(k, *ck_json, ck->progress);
  k->callback([ck, ck_json, ck_mib] {
    if (!runs_here()) return;
    ck->bytes = *ck_mib << 20;
    print_report(bench::run_checkpoint_bench(*ck), *ck_json);
  });

  auto ops = std::make_shared<bench::OpsBenchOptions>();
  auto ops_json = std::make_shared<bool>(false);
  CLI::App* o = bench->add_subcommand(
      "ops", "the DTensor operator path: dispatch, gemm, elementwise, tp_mlp_forward (threads)");
  o->add_option("--devices", ops->devices, "device threads for dispatch, gemm and elementwise")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  o->add_option("--reps", ops->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  add_output_flags(o, *ops_json, ops->progress);
  o->callback([ops, ops_json] {
    if (runs_here()) print_report(bench::run_ops_bench(*ops), *ops_json);
  });

  auto kernels = std::make_shared<bench::KernelsBenchOptions>();
  auto kernels_json = std::make_shared<bool>(false);
  CLI::App* kc = bench->add_subcommand(
      "kernels",
      "every operator of the bench GPT's training step alone at its shapes, forward and backward: "
      "products against bare cblas_sgemm, memory-bound kernels against memcpy of the bytes they "
      "move, attention against PyTorch; PyTorch's same operator beside each (vs_pytorch)");
  kc->add_option("--threads", kernels->threads,
                 "threads the one device computes with (default: every core this process may "
                 "run on); PyTorch runs with as many")
      ->check(CLI::Range(1, kMostThreads));
  kc->add_option("--reps", kernels->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  kc->add_option("--cases", kernels->cases, "only these cases, e.g. attention_bwd softmax_ce_fwd");
  add_output_flags(kc, *kernels_json, kernels->progress);
  kc->callback([kernels, kernels_json] {
    if (runs_here()) print_report(bench::run_kernels_bench(*kernels), *kernels_json);
  });

  auto train = std::make_shared<bench::TrainBenchOptions>();
  auto train_json = std::make_shared<bool>(false);
  CLI::App* t = bench->add_subcommand(
      "train",
      "the PCG runtime: an MLP's training step on 1, 2, 4 and 2x2 devices, a GPT's on 1 and 2 "
      "with SGD and with AdamW (its optimizer against the floor), each in 4 micro-batches against "
      "1, each reading a dataset against a fixed batch, every step against explain's estimate "
      "(est_vs_measured), the bytes a GPT block moves under TP + SP, the PyTorch GPT of "
      "examples/torch converted by from_torch against PyTorch eager; compile time");
  t->add_option("--reps", train->reps, "timed repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  t->add_option("--batch", train->batch, "the MLP's batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  t->add_option("--width", train->in, "the MLP's input and output width")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  t->add_option("--hidden", train->hidden, "the MLP's hidden width")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  t->add_option("--layers", train->layers, "layers of the compiled MLP")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  t->add_option("--gpt-batch", train->gpt.batch, "the GPT's batch")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  t->add_option("--gpt-seq", train->gpt.seq, "the GPT's sequence length")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  t->add_option("--gpt-width", train->gpt.width, "the GPT's width (a multiple of --gpt-heads)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  t->add_option("--gpt-heads", train->gpt.heads, "the GPT's attention heads")
      ->check(CLI::Range(1, 1 << 10))
      ->capture_default_str();
  t->add_option("--gpt-vocab", train->gpt.vocab, "the GPT's vocabulary")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  t->add_option("--gpt-blocks", train->gpt.blocks, "the GPT's blocks")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  t->add_option("--threads-per-device", train->threads_per_device,
                "threads each device computes with (default: the cores divided by the devices, "
                "at least 1); PyTorch runs with the devices' threads together")
      ->check(CLI::Range(1, kMostThreads));
  t->add_option("--cases", train->cases,
                "only these cases: train_step, mlp_step_data, mlp_step_micro4, "
                "mlp_step_adamw_zero1, mlp_step_adamw_zero3, gpt_step, gpt_step_adamw, "
                "gpt_step_selective, gpt_step_full, gpt_step_data, gpt_step_micro4, gpt_sp_bytes, "
                "torch_gpt, gpt_text, compile")
      ->check(
          CLI::IsMember({"train_step", "mlp_step_data", "mlp_step_micro4", "mlp_step_adamw_zero1",
                         "mlp_step_adamw_zero3", "gpt_step", "gpt_step_adamw", "gpt_step_selective",
                         "gpt_step_full", "gpt_step_data", "gpt_step_micro4", "gpt_sp_bytes",
                         "torch_gpt", "gpt_text", "compile"}));
  t->add_option("--text-steps", train->text_steps,
                "gpt_text: the steps meshflow and PyTorch each train (needs Debian's fortunes)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  auto train_machine = std::make_shared<std::string>();
  t->add_option("--machine", *train_machine, machine_help(MachineUse::kMeasure));
  add_output_flags(t, *train_json, train->progress);
  t->callback([train, train_json, train_machine] {
    train->machine = bench_machine(*train_machine);
    if (runs_here()) print_report(bench::run_train_bench(*train), *train_json);
  });

  struct Simulate {
    bool on = false;
    std::string machine;
  };
  auto simulate = std::make_shared<Simulate>();
  CLI::App* overlap = add_distributed(
      bench, "overlap",
      "all-gather + GEMM (permute, broadcast and, on threads, in-place forms) and GEMM + "
      "reduce-scatter (ring and, on threads, in place), decomposed against sequential; x is "
      "[bytes / 2 KiB, 512], w [512, 512]",
      "--cases", "subset, e.g. allgather_gemm_permute",
      [simulate](const DistributedRun& r, bool* printer) {
        const std::shared_ptr<const ChosenMachine> machine =
            simulate->on
                ? machine_option(simulate->machine, MachineUse::kBuiltIn, Backend::kThreads, 1)
                : nullptr;
        return bench::run_overlap_bench({.progress = r.progress,
                                         .backend = r.backend,
                                         .devices = r.devices,
                                         .sizes = r.sizes,
                                         .cases = r.subset,
                                         .reps = r.reps,
                                         .simulate = machine ? &machine->machine : nullptr},
                                        printer);
      });
  overlap->add_flag("--simulate", simulate->on,
                    "run nothing: the cost model's timeline of each case on --machine, links and "
                    "compute independent");
  overlap->add_option("--machine", simulate->machine,
                      "machine description JSON for --simulate (default: the built-in one)");
  add_distributed(bench, "collectives",
                  "every collective against its memcpy floor (threads) or raw MPI (mpi)",
                  "--collectives", "subset, e.g. all_gather,all_reduce",
                  [](const DistributedRun& r, bool* printer) {
                    return bench::run_collectives_bench({.progress = r.progress,
                                                         .backend = r.backend,
                                                         .devices = r.devices,
                                                         .sizes = r.sizes,
                                                         .collectives = r.subset,
                                                         .reps = r.reps},
                                                        printer);
                  });
  add_distributed(bench, "redistribute",
                  "S(0)->R, S(0)->S(1), P(sum)->S(0), P(sum)->R against memcpy floors; planning "
                  "times",
                  "--cases", "subset, e.g. \"S(0)->R\"",
                  [](const DistributedRun& r, bool* printer) {
                    return bench::run_redistribute_bench({.progress = r.progress,
                                                          .backend = r.backend,
                                                          .devices = r.devices,
                                                          .sizes = r.sizes,
                                                          .cases = r.subset,
                                                          .reps = r.reps},
                                                         printer);
                  });
}

}  // namespace meshflow::cli
