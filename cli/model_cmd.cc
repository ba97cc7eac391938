// `meshflow run`, `meshflow train` and `meshflow explain`: a model file (DESIGN.md's "Models")
// run forward, trained, or shown as what it compiles into.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "meshflow/auto/autoshard.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/train/checkpoint.h"
#include "meshflow/train/trainer.h"

namespace meshflow::cli {

namespace {

struct CommonArgs {
  std::string model, backend, machine, save, trace, gather_form;
  bool json = false, overlap = false;
  int threads_per_device = 0;  // 0: default_threads_per_device
  double timeout_s = 60;       // --timeout: how long a device may be silent
};

void add_common(CLI::App* cmd, CommonArgs& a, bool runs) {
  cmd->add_option("model", a.model, "the model file (JSON)")->required();
  cmd->add_option("--backend", a.backend,
                  runs ? "threads or mpi (default: mpi under mpirun, else threads)"
                       : "explain the run on threads or mpi (default: mpi under mpirun, else "
                         "threads)");
  if (runs) {
    cmd->add_option("--trace", a.trace,
                    "write a Chrome/Perfetto trace JSON (a process per device: tasks, transfers)");
    cmd->add_option("--timeout", a.timeout_s,
                    "seconds a device may keep its peers waiting in a collective before the run "
                    "fails on every device (exit 3)")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
  }
  cmd->add_option("--threads-per-device", a.threads_per_device,
                  runs ? "threads each device computes with, >= 1 (default: this machine's cores "
                         "divided by the devices, at least 1)"
                       : "estimate the step with this many threads per device (default: this "
                         "machine's cores divided by the devices, at least 1)")
      ->check(CLI::Range(1, kMostThreads));
  cmd->add_option("--machine", a.machine,
                  machine_help(runs ? MachineUse::kCached : MachineUse::kMeasure));
  cmd->add_flag("--overlap", a.overlap,
                "run all-gathers into and reduce-scatters out of matrix products as loops that "
                "overlap each block's transfer with the product, where the cost model estimates "
                "the loop shorter");
  cmd->add_option("--gather-form", a.gather_form,
                  "with --overlap, decompose every such collective, all-gathers in this form: "
                  "permute, broadcast or in_place (threads) (default: the cost model decides "
                  "where and how)")
      ->check(CLI::IsMember({"permute", "broadcast", "in_place"}));
  cmd->add_flag("--json", a.json, "print JSON");
}

// The optimizer options of train and explain (train/optimizer.h), kept as text so that every
// value, "nan" included, reaches resolve_optimizer's checks and their one-line errors.
struct OptimizerArgs {
  std::string optimizer, lr, momentum, betas, eps, weight_decay, clip_grad_norm, warmup_steps,
      decay, decay_steps;
};

void add_optimizer_options(CLI::App* cmd, OptimizerArgs& a) {
  cmd->add_option("--optimizer", a.optimizer,
                  "sgd (torch.optim.SGD) or adamw (torch.optim.AdamW) (default: the model "
                  "file's \"train\", else sgd)");
  cmd->add_option("--lr", a.lr, "learning rate, lr (default: sgd 0.1, adamw 0.001)");
  cmd->add_option("--momentum", a.momentum, "sgd: momentum in [0, 1) (default 0)");
  cmd->add_option("--betas", a.betas, "adamw: betas B1,B2, each in [0, 1) (default 0.9,0.999)");
  cmd->add_option("--eps", a.eps, "adamw: eps > 0 (default 1e-8)");
  cmd->add_option("--weight-decay", a.weight_decay,
                  "adamw: decoupled weight_decay >= 0 (default 0.01)");
  cmd->add_option("--clip-grad-norm", a.clip_grad_norm,
                  "scale every gradient by min(1, X / (global L2 norm + 1e-6)) before the update "
                  "(torch.nn.utils.clip_grad_norm_'s max_norm)");
  cmd->add_option("--warmup-steps", a.warmup_steps,
                  "learning rate lr*t/W for steps t <= W (default 0)");
  cmd->add_option("--decay", a.decay,
                  "none, cosine or linear: the learning rate falls from lr to 0 over "
                  "--decay-steps after the warmup (default none)");
  cmd->add_option("--decay-steps", a.decay_steps, "steps the decay takes, >= 1");
}

// Returns `text` as a number; throws naming `flag` when it is none (finiteness and ranges are
// resolve_optimizer's).
double number_option(std::string_view flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size())
    fail(ErrorKind::kInvalidArgument, "--{} \"{}\": not a number", flag, text);
  return v;
}

int integer_option(std::string_view flag, const std::string& text) {
  const double v = number_option(flag, text);
  if (v != std::floor(v) || std::abs(v) > (1 << 30))
    fail(ErrorKind::kInvalidArgument, "--{} {}: not an integer", flag, text);
  return static_cast<int>(v);
}

// Returns the optimizer the options and the model file's "train" object give (and a resumed
// checkpoint's saved options, between the two).
Optimizer optimizer_of(const OptimizerArgs& a, const Model& model,
                       const Checkpoint* resumed = nullptr) {
  OptimizerOptions o;
  if (!a.optimizer.empty()) {
    o.kind = parse_optimizer_kind(a.optimizer);
    if (!o.kind) {
      fail(ErrorKind::kInvalidArgument, "--optimizer \"{}\": must be sgd or adamw", a.optimizer);
    }
  }
  auto number = [](std::optional<double>& out, std::string_view flag, const std::string& text) {
    if (!text.empty()) out = number_option(flag, text);
  };
  number(o.lr, "lr", a.lr);
  number(o.momentum, "momentum", a.momentum);
  number(o.eps, "eps", a.eps);
  number(o.weight_decay, "weight-decay", a.weight_decay);
  number(o.clip_grad_norm, "clip-grad-norm", a.clip_grad_norm);
  if (!a.betas.empty()) {
    const auto comma = a.betas.find(',');
    if (comma == std::string::npos)
      fail(ErrorKind::kInvalidArgument, "--betas \"{}\": must be B1,B2", a.betas);
    o.betas = std::pair{number_option("betas", a.betas.substr(0, comma)),
                        number_option("betas", a.betas.substr(comma + 1))};
  }
  if (!a.warmup_steps.empty()) o.warmup_steps = integer_option("warmup-steps", a.warmup_steps);
  if (!a.decay_steps.empty()) o.decay_steps = integer_option("decay-steps", a.decay_steps);
  if (!a.decay.empty()) {
    o.decay = parse_lr_decay(a.decay);
    if (!o.decay) {
      fail(ErrorKind::kInvalidArgument, "--decay \"{}\": must be none, cosine or linear", a.decay);
    }
  }
  const OptimizerOptions file = train_defaults_from_json(model.train, model.source).optimizer;
  return resolve_optimizer(o, resumed ? resumed_defaults(*resumed, o, file) : file);
}

// Returns --micro-batches when given (0: not given), else the model file's, else 1.
int micro_batches_of(int given, const Model& model) {
  if (given > 0) return given;
  return train_defaults_from_json(model.train, model.source).micro_batches.value_or(1);
}

// Returns --zero when given (-1: not given), else the model file's, else 0.
int zero_of(int given, const Model& model) {
  return resolve_zero(given >= 0 ? std::optional<int>(given) : std::nullopt,
                      train_defaults_from_json(model.train, model.source));
}

// Returns --schedule when given (empty: not given), else the model file's, else 1f1b.
Schedule chosen_schedule(const std::string& given, const Model& model) {
  return resolve_schedule(given.empty() ? std::nullopt : std::optional(given),
                          train_defaults_from_json(model.train, model.source));
}

// Returns --recompute when given (empty: not given), else the model file's, else none.
Recompute chosen_recompute(const std::string& given, const Model& model) {
  return resolve_recompute(given.empty() ? std::nullopt : std::optional(given),
                           train_defaults_from_json(model.train, model.source));
}

// Adds --zero.
void add_zero_option(CLI::App* cmd, int& zero) {
  cmd->add_option("--zero", zero,
                  "ZeRO level: 0 (every device holds whole weights, gradients and optimizer "
                  "state), 1 (optimizer state sharded over the data-parallel dims, gradients "
                  "reduce-scattered into it, weights all-gathered after the update), 3 (FSDP: "
                  "weights and gradients sharded too, each weight gathered just before each use; "
                  "default: the model file's \"train\", else 0)");
}

// Returns the form --gather-form names (checked by CLI11), or none.
std::optional<GatherForm> gather_form(const CommonArgs& a) {
  for (GatherForm f : {GatherForm::kPermute, GatherForm::kBroadcast, GatherForm::kInPlace})
    if (a.gather_form == to_string(f)) return f;
  return std::nullopt;
}

Backend backend(const CommonArgs& a) { return backend_option(a.backend); }

ModelRunOptions run_options(const CommonArgs& a, const MachineModel* machine) {
  ModelRunOptions o;
  o.backend = backend(a);
  o.plan.machine = machine;
  o.overlap = a.overlap;
  o.gather_form = gather_form(a);
  o.overlap_always = o.gather_form.has_value();  // a named form is the caller's decision
  if (!a.save.empty()) o.save = a.save;
  if (!a.trace.empty()) o.trace = a.trace;
  o.threads_per_device = a.threads_per_device;
  o.timeout = timeout_of_seconds(a.timeout_s);
  return o;
}

// Returns the description --machine names for `devices` devices of `a`'s run.
std::shared_ptr<const ChosenMachine> machine_of(const CommonArgs& a, MachineUse use, int devices) {
  return machine_option(a.machine, use, backend_option(a.backend), devices, a.threads_per_device);
}

// Returns fn(). Under mpi every rank computes the same from the same input and fails alike, so
// its error is reported once (by device 0) rather than by every rank.
template <typename Fn>
auto every_device(Backend backend, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (backend != Backend::kMpi) throw;
    throw Error(e.kind(), e.what(), ErrorScope::kEveryDevice);
  }
}

// Returns the model in `path`, read alike by every rank under mpi.
Model load(const std::string& path, Backend backend) {
  return every_device(backend, [&] { return load_model(path); });
}

// Prints "step 3/10 [#####     ] loss 2.3012  4.1 steps/s" on standard error (steps `first`
// to `last`; a resumed run's numbers go on): redrawn in place on a terminal, one line per step
// otherwise.
void print_progress(const StepReport& r, int first, int last, double elapsed_s) {
  constexpr int kWidth = 20;
  const int done = r.step - first + 1, total = last - first + 1;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  const bool tty = ::isatty(STDERR_FILENO);
  const std::string rate = r.tokens_per_s ? fmt::format("  {:.0f} tokens/s", *r.tokens_per_s)
                                          : fmt::format("  {:.0f} samples/s", r.samples_per_s);
  const std::string val =
      r.last_val_loss ? fmt::format("  val loss {:.6g}", *r.last_val_loss) : std::string();
  fmt::print(stderr, "{}step {}/{} [{}{}] loss {:.6g}{}  {:.2f} steps/s{}{}", tty ? "\r" : "",
             r.step, last, std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(kWidth - filled), ' '), r.loss, val,
             elapsed_s > 0 ? done / elapsed_s : 0.0, rate, tty && r.step < last ? "" : "\n");
  std::fflush(stderr);
}

void add_schedule_option(CLI::App* cmd, std::string& schedule) {
  cmd->add_option("--schedule", schedule,
                  "where the model's layers lie on different meshes (stages): the order each "
                  "stage runs its micro-batches in, all stages at once: gpipe (every forward, "
                  "then every backward), 1f1b (PipeDream-flush) or zb (zero-bubble ZB-H1, weight "
                  "gradients deferred into the waits) (default: the model file's \"train\", else "
                  "1f1b)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb"}));
}

void add_recompute_option(CLI::App* cmd, std::string& recompute) {
  cmd->add_option("--recompute", recompute,
                  "activation recomputation: none (keep every activation backward reads), "
                  "selective (keep products, adds and marked values; recompute norms, pointwise "
                  "results and copies) or full (keep only inputs and the values of nodes marked "
                  "\"checkpoint\": true; recompute each segment before its backward) (default: "
                  "the model file's \"train\", else none)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
}

// Adds autoshard's --mesh and --memory-limit.
void add_search_options(CLI::App* cmd, std::string& mesh, std::optional<std::int64_t>& limit) {
  cmd->add_option("--mesh", mesh,
                  "search on one mesh of this shape (\"4\", \"2x2\") for the whole model "
                  "instead of its own meshes");
  cmd->add_option("--memory-limit", limit,
                  "bytes each device may hold at its peak (explain's memory_per_device_bytes)")
      ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));
}

// The search's options from the command line: what is given stays fixed.
AutoshardOptions search_options(const CommonArgs& a, const OptimizerArgs& optimizer,
                                const Model& model, const std::string& mesh,
                                std::optional<std::int64_t> limit, int zero, int micro_batches,
                                const std::string& recompute, const MachineModel* machine) {
  AutoshardOptions o{.memory_limit = limit,
                     .update = optimizer_of(optimizer, model).rule,
                     .plan = {.machine = machine},
                     .threads_per_device = a.threads_per_device};
  if (!mesh.empty()) o.mesh = mesh;
  if (zero >= 0) o.zero = zero;
  if (micro_batches > 0) o.micro_batches = micro_batches;
  if (!recompute.empty()) o.recompute = parse_recompute(recompute);
  return o;
}

}  // namespace

void add_run(CLI::App& app) {
  auto args = std::make_shared<CommonArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model file's forward pass on its meshes");
  add_common(cmd, *args, /*runs=*/true);
  cmd->add_option("--save", args->save, "write each output as a sharded folder DIR/<name>/");
  cmd->callback([args] {
    const Model model = load(args->model, backend(*args));
    const auto machine = machine_of(*args, MachineUse::kCached, model_device_count(model));
    const ModelRunOptions options = run_options(*args, &machine->machine);
    const std::optional<ModelData> data =
        every_device(options.backend, [&] { return read_model_data(model); });
    const RunReport r = run_model_on_data(model, data, options);
    if (!r.reporter) return;
    if (args->json) {
      nlohmann::json outputs = nlohmann::json::object();
      for (const auto& [name, layout] : r.outputs) {
        outputs[name] = layout_json(layout);
        outputs[name]["shape"] = layout.shape;
      }
      fmt::print("{}\n", nlohmann::json{{"outputs", outputs}}.dump(2));
      return;
    }
    for (const auto& [name, layout] : r.outputs) {
      std::string value;
      for (const auto& [n, v] : r.scalars)
        if (n == name) value = fmt::format("  = {:.9g}", v);
      fmt::print("{}  {} {}  {} {}{}\n", name, to_string(layout.mesh), to_string(layout.placements),
                 to_string(layout.dtype), to_string(layout.shape), value);
    }
    if (!args->save.empty()) fmt::print("saved the outputs in {}\n", args->save);
  });
}

void add_train(CLI::App& app) {
  struct Args : CommonArgs {
    int steps = 1, micro_batches = 0;  // 0: not given
    int zero = -1;                     // -1: not given
    bool check = false, allow_nonfinite = false;
    std::string checkpoint, resume;
    int checkpoint_every = 0, keep_last = 0;  // 0: not given
    std::string schedule, recompute;          // empty: not given
    OptimizerArgs optimizer;
    bool autoshard = false;
    std::string mesh;
    std::optional<std::int64_t> memory_limit;
    int eval_every = 0, eval_batches = 20;
    std::string log_dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model file on its meshes with SGD or AdamW, clipping and a schedule");
  add_common(cmd, *args, /*runs=*/true);
  cmd->add_option("--steps", args->steps, "training steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  add_optimizer_options(cmd, args->optimizer);
  cmd->add_option("--micro-batches", args->micro_batches,
                  "split each step's inputs along dim 0 into M micro-batches, accumulating the "
                  "gradients and updating once per step (default: the model file's \"train\", "
                  "else 1)")
      ->check(CLI::Range(1, 1 << 20));
  add_zero_option(cmd, args->zero);
  add_schedule_option(cmd, args->schedule);
  add_recompute_option(cmd, args->recompute);
  cmd->add_flag("--allow-nonfinite", args->allow_nonfinite,
                "train on through a step whose loss or gradient norm is not finite (by default "
                "such a step stops training before its update, writing nothing)");
  cmd->add_flag("--check", args->check,
                "also train on one device and report the largest loss, weight and gradient "
                "differences");
  cmd->add_option("--save", args->save, "write each weight after the last step to DIR/<name>/");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "write DIR/step-<k>/ (every weight and optimizer state, sharded as it lives, "
                  "hashed, committed whole) after the last step and every --checkpoint-every K");
  cmd->add_option("--checkpoint-every", args->checkpoint_every,
                  "with --checkpoint: also after every step whose number is a multiple of K")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--keep-last", args->keep_last,
                  "with --checkpoint: keep only the newest N complete checkpoints")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--resume", args->resume,
                  "resume from DIR/step-<k>, or the newest complete checkpoint in DIR, onto this "
                  "model's layouts; steps go on from k+1 and the saved optimizer options are the "
                  "defaults. auto (with --checkpoint DIR): DIR's newest complete checkpoint if "
                  "there is one, else step 1, with --steps N the last step number");
  cmd->add_option("--eval-every", args->eval_every,
                  "after every step whose number is a multiple of K and after the last, the "
                  "mean loss over --eval-batches batches of the val split (forward only)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--eval-batches", args->eval_batches, "val batches each evaluation reads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--log-dir", args->log_dir,
                  "append one JSON line per step and per evaluation to DIR/metrics.jsonl and "
                  "plot train and val loss in DIR/loss.svg");
  cmd->add_flag("--auto", args->autoshard,
                "train what `meshflow autoshard` chooses for the model (placements, ZeRO level, "
                "micro-batches, recomputation; each option given here stays fixed)");
  add_search_options(cmd, args->mesh, args->memory_limit);
  cmd->callback([args] {
    if (!args->autoshard && (!args->mesh.empty() || args->memory_limit))
      fail(ErrorKind::kInvalidArgument, "--{} needs --auto",
           args->mesh.empty() ? "memory-limit" : "mesh");
    if (args->checkpoint.empty() && (args->checkpoint_every > 0 || args->keep_last > 0)) {
      fail(ErrorKind::kInvalidArgument, "--{} needs --checkpoint DIR",
           args->checkpoint_every > 0 ? "checkpoint-every" : "keep-last");
    }
    Model model = load(args->model, backend(*args));
    std::optional<AutoshardOptions> search;  // --auto: checked before any measurement
    if (args->autoshard) {
      search = every_device(backend(*args), [&] {
        return search_options(*args, args->optimizer, model, args->mesh, args->memory_limit,
                              args->zero, args->micro_batches, args->recompute, nullptr);
      });
    }
    // --auto estimates (and measures this machine where it must); a plain run reads the cache.
    const auto machine =
        machine_of(*args, args->autoshard ? MachineUse::kMeasure : MachineUse::kCached,
                   args->autoshard && !args->mesh.empty() ? size(parse_mesh(args->mesh))
                                                          : model_device_count(model));
    const ModelRunOptions options = run_options(*args, &machine->machine);
    if (search) {
      search->plan.machine = &machine->machine;
      model = every_device(options.backend, [&] {
        const AutoshardResult r =
            autoshard(args->model, *search, std::filesystem::path(args->model).parent_path());
        const std::filesystem::path base = std::filesystem::path(args->model).parent_path();
        return parse_model(r.model.dump(), base.empty() ? "." : base, args->model);
      });
    }
    std::optional<Checkpoint> resumed;
    int steps = args->steps;
    if (args->resume == "auto") {
      // The same command line serves the first run and every restart: the newest complete
      // checkpoint if there is one, and --steps as the last step number.
      if (args->checkpoint.empty())
        fail(ErrorKind::kInvalidArgument, "--resume auto needs --checkpoint DIR");
      resumed = every_device(options.backend, [&]() -> std::optional<Checkpoint> {
        const auto complete = complete_checkpoints(output_target(args->checkpoint));
        if (complete.empty()) return std::nullopt;
        return read_checkpoint(complete.back());
      });
      if (resumed) steps = args->steps - resumed->step;
      if (steps <= 0) {
        if (reports(options))
          fmt::print(stderr, "checkpoint step-{} is at or past --steps {}: no step to run\n",
                     resumed->step, args->steps);
        return;
      }
    } else if (!args->resume.empty()) {
      resumed =
          every_device(options.backend, [&] { return read_checkpoint(resume_path(args->resume)); });
    }
    TrainOptions o{
        .run = options,
        .steps = steps,
        .optimizer = every_device(
            options.backend,
            [&] { return optimizer_of(args->optimizer, model, resumed ? &*resumed : nullptr); }),
        .micro_batches = every_device(options.backend,
                                      [&] { return micro_batches_of(args->micro_batches, model); }),
        .schedule =
            every_device(options.backend, [&] { return chosen_schedule(args->schedule, model); }),
        .zero = every_device(options.backend, [&] { return zero_of(args->zero, model); }),
        .recompute =
            every_device(options.backend, [&] { return chosen_recompute(args->recompute, model); }),
        .allow_nonfinite = args->allow_nonfinite,
        .check = args->check,
        .eval_every = args->eval_every,
        .eval_batches = args->eval_batches};
    if (!args->log_dir.empty()) o.log_dir = args->log_dir;
    o.on_eval = [](const EvalReport& e) {
      fmt::print(stderr, "eval at step {}: val loss {:.6g}\n", e.step, e.val_loss);
      std::fflush(stderr);
    };
    if (!args->checkpoint.empty()) {
      o.checkpoint = CheckpointOptions{.dir = output_target(args->checkpoint),
                                       .every = args->checkpoint_every,
                                       .keep_last = args->keep_last};
    }
    if (resumed) o.resume = resumed->path;
    const int first = resumed ? resumed->step + 1 : 1;
    double elapsed = 0;
    o.progress = [&, first](const StepReport& r) {
      elapsed += r.seconds;
      print_progress(r, first, first + steps - 1, elapsed);
    };
    const TrainReport r = train_model(model, o);
    if (!r.reporter) return;
    if (args->json) {
      fmt::print("{}\n", to_json(r).dump(2));
      return;
    }
    fmt::print("step  loss          seconds\n");
    for (const StepReport& s : r.steps)
      fmt::print("{:>4}  {:<12.8g}  {:.4f}\n", s.step, s.loss, s.seconds);
    if (r.check) {
      fmt::print(
          "check against one device: max loss diff {:.3g}, max weight diff {:.3g}, "
          "max grad diff {:.3g}{}\n",
          r.check->max_loss_diff, r.check->max_weight_diff, r.check->max_grad_diff,
          r.check->max_val_loss_diff
              ? fmt::format(", max val loss diff {:.3g}", *r.check->max_val_loss_diff)
              : std::string());
    }
    if (!args->save.empty()) fmt::print("saved the weights in {}\n", args->save);
    if (!args->checkpoint.empty() && !r.steps.empty()) {
      fmt::print("checkpoint {}/step-{}\n", output_target(args->checkpoint).string(),
                 r.steps.back().step);
    }
  });
}

void add_explain(CLI::App& app) {
  struct Args : CommonArgs {
    OptimizerArgs optimizer;
    int micro_batches = 0;            // 0: not given
    int zero = -1;                    // -1: not given
    std::string schedule, recompute;  // empty: not given
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain",
      "Show every value's layout (optimizer state included) and every data movement a model "
      "compiles into");
  add_common(cmd, *args, /*runs=*/false);
  add_optimizer_options(cmd, args->optimizer);
  cmd->add_option("--micro-batches", args->micro_batches,
                  "compile the step for M micro-batches (the layouts of one micro-batch; default: "
                  "the model file's \"train\", else 1)")
      ->check(CLI::Range(1, 1 << 20));
  add_zero_option(cmd, args->zero);
  add_schedule_option(cmd, args->schedule);
  add_recompute_option(cmd, args->recompute);
  cmd->callback([args] {
    const Model model = load(args->model, backend(*args));
    const Optimizer optimizer =
        every_device(backend(*args), [&] { return optimizer_of(args->optimizer, model); });
    const TrainingCompile training{
        .update = optimizer.rule,
        .micro_batches = every_device(backend(*args),
                                      [&] { return micro_batches_of(args->micro_batches, model); }),
        .zero = every_device(backend(*args), [&] { return zero_of(args->zero, model); }),
        .recompute =
            every_device(backend(*args), [&] { return chosen_recompute(args->recompute, model); })};
    // Measured (where it must be) once every option has been checked.
    const auto machine = machine_of(*args, MachineUse::kMeasure, model_device_count(model));
    const PlanOptions plan{.machine = &machine->machine};
    Explanation e = explain_compiled(
        model.pcg, {.plan = plan,
                    .overlap = args->overlap,
                    .decompose = {.shared_memory = backend(*args) == Backend::kThreads,
                                  .gather_form = gather_form(*args),
                                  .always = gather_form(*args).has_value()},
                    .update = training.update,
                    .micro_batches = training.micro_batches,
                    .zero = training.zero,
                    .recompute = training.recompute,
                    .threads_per_device = args->threads_per_device});
    // The pipeline's schedule, where the step runs on stages: its memory is the pipeline's.
    const std::optional<ScheduleExplanation> schedule = explain_model_schedule(
        model, run_options(*args, &machine->machine), training,
        every_device(backend(*args), [&] { return chosen_schedule(args->schedule, model); }));
    if (schedule && schedule->memory) e.memory = schedule->memory;
    every_device(backend(*args), [&] {
      add_loader_memory(model, e);
      return 0;
    });
    if (args->json) {
      nlohmann::json j = to_json(e);
      j.update(to_json(schedule));
      fmt::print("{}\n", j.dump(2));
      return;
    }
    if (!model.pcg.loss) fmt::print("(the model names no loss: forward pass only)\n");
    fmt::print("{}{}", to_text(e), to_text(schedule));
  });
}

void add_autoshard(CLI::App& app) {
  struct Args : CommonArgs {
    OptimizerArgs optimizer;
    int micro_batches = 0;  // 0: not given
    int zero = -1;          // -1: not given
    std::string mesh, out;
    std::string recompute;  // empty: not given
    std::optional<std::int64_t> memory_limit;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "autoshard",
      "Choose the placements of every tensor and node, the ZeRO level, the micro-batches and "
      "the activation recomputation that make the estimated step fastest within a memory "
      "limit, and write the model file");
  cmd->add_option("model", args->model, "the model file (JSON)")->required();
  add_search_options(cmd, args->mesh, args->memory_limit);
  add_optimizer_options(cmd, args->optimizer);
  add_zero_option(cmd, args->zero);
  cmd->add_option("--micro-batches", args->micro_batches,
                  "fix the micro-batches (default: searched, or the model file's \"train\")")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--recompute", args->recompute,
                  "fix the activation recomputation: none, selective or full (default: searched "
                  "under --memory-limit, else none; or the model file's \"train\")")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--machine", args->machine, machine_help(MachineUse::kMeasure));
  cmd->add_option("--threads-per-device", args->threads_per_device,
                  "estimate with this many threads per device (default: this machine's cores "
                  "divided by the devices, at least 1)")
      ->check(CLI::Range(1, kMostThreads));
  cmd->add_option("--out", args->out, "write the chosen model file here (runs with `train`)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args] {
    const Model model = load_model(args->model);
    const std::filesystem::path out_dir = args->out.empty()
                                              ? std::filesystem::path(args->model).parent_path()
                                              : std::filesystem::path(args->out).parent_path();
    if (!args->out.empty() && !out_dir.empty() && !std::filesystem::is_directory(out_dir))
      fail(ErrorKind::kIo, "--out {}: the folder {} does not exist", args->out, out_dir.string());
    AutoshardOptions search =
        search_options(*args, args->optimizer, model, args->mesh, args->memory_limit, args->zero,
                       args->micro_batches, args->recompute, nullptr);
    // Measured (where it must be) once every option has been checked.
    const auto machine =
        machine_of(*args, MachineUse::kMeasure,
                   args->mesh.empty() ? model_device_count(model) : size(parse_mesh(args->mesh)));
    search.plan.machine = &machine->machine;
    const AutoshardResult r = autoshard(args->model, search, out_dir.empty() ? "." : out_dir);
    if (!args->out.empty()) write_file_atomic(args->out, r.model.dump(2) + "\n");
    if (args->json) {
      fmt::print("{}\n", to_json(r).dump(2));
      return;
    }
    fmt::print(
        "est_step_s {:.6g} (the model's own placements: {}), {} bytes per device, zero {}, "
        "micro-batches {}, recompute {}; searched in {:.2f} s, priced in {:.2f} s{}\n",
        r.est_step_s,
        r.given_est_step_s ? fmt::format("{:.6g}", *r.given_est_step_s) : "do not fit",
        r.memory_per_device_bytes, r.zero, r.micro_batches, to_string(r.recompute), r.search_s,
        r.priced_s, r.exact ? "" : " (heuristic: the graph is far from series-parallel)");
    for (const auto& [name, layout] : r.values)
      fmt::print("{}  {} {}\n", name, explicit_text(layout.mesh), to_string(layout.placements));
    if (!args->out.empty()) fmt::print("wrote {}\n", args->out);
  });
}

}  // namespace meshflow::cli
