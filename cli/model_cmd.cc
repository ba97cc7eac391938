// `meshflow run`, `meshflow train` and `meshflow explain`: a model file (DESIGN.md's "Models")
// run forward, trained, or shown as what it compiles into.
#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/runtime/model_runner.h"

namespace meshflow::cli {

namespace {

struct CommonArgs {
  std::string model, backend, machine, save, trace, gather_form;
  bool json = false, overlap = false;
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
  }
  cmd->add_option("--machine", a.machine, "machine description JSON for the cost model");
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

// Returns the form --gather-form names (checked by CLI11), or none.
std::optional<GatherForm> gather_form(const CommonArgs& a) {
  for (GatherForm f : {GatherForm::kPermute, GatherForm::kBroadcast, GatherForm::kInPlace})
    if (a.gather_form == to_string(f)) return f;
  return std::nullopt;
}

Backend backend(const CommonArgs& a) {
  return a.backend.empty() ? detect_backend() : parse_backend(a.backend);
}

ModelRunOptions run_options(const CommonArgs& a, const MachineModel* machine) {
  ModelRunOptions o;
  o.backend = backend(a);
  o.plan.machine = machine;
  o.overlap = a.overlap;
  o.gather_form = gather_form(a);
  o.overlap_always = o.gather_form.has_value();  // a named form is the caller's decision
  if (!a.save.empty()) o.save = a.save;
  if (!a.trace.empty()) o.trace = a.trace;
  return o;
}

// Returns the model in `path`. Under mpi every rank reads the same file and fails alike, so a
// bad file is reported once (by device 0) rather than by every rank.
Model load(const std::string& path, Backend backend) {
  try {
    return load_model(path);
  } catch (const Error& e) {
    if (backend != Backend::kMpi) throw;
    throw Error(e.kind(), e.what(), ErrorScope::kEveryDevice);
  }
}

// Prints "step 3/10 [#####     ] loss 2.3012  4.1 steps/s" on standard error: redrawn in
// place on a terminal, one line per step otherwise.
void print_progress(const StepReport& r, int steps, double elapsed_s) {
  constexpr int kWidth = 20;
  const int filled = steps > 0 ? r.step * kWidth / steps : kWidth;
  const bool tty = ::isatty(STDERR_FILENO);
  fmt::print(stderr, "{}step {}/{} [{}{}] loss {:.6g}  {:.2f} steps/s{}", tty ? "\r" : "", r.step,
             steps, std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(kWidth - filled), ' '), r.loss,
             elapsed_s > 0 ? r.step / elapsed_s : 0.0, tty && r.step < steps ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace

void add_run(CLI::App& app) {
  auto args = std::make_shared<CommonArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model file's forward pass on its meshes");
  add_common(cmd, *args, /*runs=*/true);
  cmd->add_option("--save", args->save, "write each output as a sharded folder DIR/<name>/");
  cmd->callback([args] {
    auto machine = machine_option(args->machine);
    const ModelRunOptions options = run_options(*args, machine.get());
    const Model model = load(args->model, options.backend);
    const RunReport r = run_model(model, options);
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
    int steps = 1;
    double lr = 0.1;
    bool check = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model file with SGD on its meshes");
  add_common(cmd, *args, /*runs=*/true);
  cmd->add_option("--steps", args->steps, "training steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--lr", args->lr, "SGD learning rate")->capture_default_str();
  cmd->add_flag("--check", args->check,
                "also train on one device and report the largest loss, weight and gradient "
                "differences");
  cmd->add_option("--save", args->save, "write each weight after the last step to DIR/<name>/");
  cmd->callback([args] {
    auto machine = machine_option(args->machine);
    const ModelRunOptions options = run_options(*args, machine.get());
    const Model model = load(args->model, options.backend);
    TrainOptions o{.run = options, .steps = args->steps, .lr = args->lr, .check = args->check};
    double elapsed = 0;
    o.progress = [&](const StepReport& r) {
      elapsed += r.seconds;
      print_progress(r, args->steps, elapsed);
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
          "max grad diff {:.3g}\n",
          r.check->max_loss_diff, r.check->max_weight_diff, r.check->max_grad_diff);
    }
    if (!args->save.empty()) fmt::print("saved the weights in {}\n", args->save);
  });
}

void add_explain(CLI::App& app) {
  auto args = std::make_shared<CommonArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Show every value's layout and every data movement a model compiles into");
  add_common(cmd, *args, /*runs=*/false);
  cmd->callback([args] {
    auto machine = machine_option(args->machine);
    const Model model = load_model(args->model);
    const PlanOptions plan{.machine = machine.get()};
    const Explanation e = explain_compiled(
        model.pcg, {.plan = plan,
                    .overlap = args->overlap,
                    .decompose = {.shared_memory = backend(*args) == Backend::kThreads,
                                  .gather_form = gather_form(*args),
                                  .always = gather_form(*args).has_value()}});
    if (args->json) {
      fmt::print("{}\n", to_json(e).dump(2));
      return;
    }
    if (!model.pcg.loss) fmt::print("(the model names no loss: forward pass only)\n");
    fmt::print("{}", to_text(e));
  });
}

}  // namespace meshflow::cli
