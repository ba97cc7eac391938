// `meshflow plan` (explain a plan) and `meshflow redistribute` (move real data).
#include <fmt/format.h>
#include <unistd.h>

#include "cli/commands.h"
#include "meshflow/comm/launch.h"
#include "meshflow/plan/lower.h"
#include "meshflow/plan/planner.h"
#include "meshflow/runtime/redistribute_folder.h"

namespace meshflow::cli {

std::shared_ptr<const ChosenMachine> machine_option(const std::string& text, MachineUse use,
                                                    Backend backend, int devices,
                                                    int threads_per_device) {
  const MachineChoice choice = use == MachineUse::kBuiltIn && text.empty()
                                   ? parse_machine_choice("default")
                                   : parse_machine_choice(text);
  if (choice.kind != MachineChoice::Kind::kMeasured)
    return std::make_shared<const ChosenMachine>(choose_machine(choice, {}));
  const MachineCacheOptions options{.measure = use == MachineUse::kMeasure, .note = note_on_stderr};
  return std::make_shared<const ChosenMachine>(
      choose_machine(choice, machine_key(backend, devices, threads_per_device), options));
}

std::string machine_help(MachineUse use) {
  switch (use) {
    case MachineUse::kMeasure:
      return "machine description JSON for the cost model, or default (the built-in one) "
             "(default: this machine's, measured by calibrate the first time and cached)";
    case MachineUse::kCached:
      return "machine description JSON for the cost model, or default (the built-in one) "
             "(default: this machine's where calibrate has measured it, else the built-in one)";
    case MachineUse::kBuiltIn:
      break;
  }
  return "machine description JSON the plan is chosen with (default: the built-in one)";
}

Backend backend_option(const std::string& name) {
  return name.empty() ? detect_backend() : parse_backend(name);
}

void add_plan(CLI::App& app) {
  struct Args {
    std::string mesh, shape, dtype = "float32", from, to, to_mesh, machine;
    bool json = false, devices = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("plan", "Explain how a tensor moves between two layouts (no data moves)");
  cmd->add_option("--mesh", args->mesh, "source mesh, e.g. 2x2x2 or 2x2@4,5,6,7")->required();
  cmd->add_option("--shape", args->shape, "global tensor shape, e.g. 16x16x16")->required();
  cmd->add_option("--dtype", args->dtype, "float32, float64, int32 or int64")
      ->capture_default_str();
  cmd->add_option("--from", args->from, "source placements, e.g. \"P(sum),R,P(sum)\"")->required();
  cmd->add_option("--to", args->to, "destination placements")->required();
  cmd->add_option("--to-mesh", args->to_mesh, "destination mesh (default: the source mesh)");
  cmd->add_option("--machine", args->machine, machine_help(MachineUse::kCached));
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--devices", args->devices,
                "also print each device's program: every call, group, count and region it runs");
  cmd->callback([args] {
    const Shape shape = parse_shape(args->shape);
    const DType dtype = parse_dtype(args->dtype);
    const DeviceMesh mesh = parse_mesh(args->mesh);
    const Layout from = make_layout(mesh, parse_placements(args->from), shape, dtype);
    const Layout to = make_layout(args->to_mesh.empty() ? mesh : parse_mesh(args->to_mesh),
                                  parse_placements(args->to), shape, dtype);
    const auto machine = machine_option(args->machine, MachineUse::kCached, detect_backend(),
                                        static_cast<int>(std::max(size(from.mesh), size(to.mesh))));
    const Plan plan = plan_redistribute(from, to, {.machine = &machine->machine});
    if (args->json) {
      fmt::print("{}\n", to_json(plan).dump(2));
      return;
    }
    fmt::print("{}", to_text(plan));
    if (args->devices) {
      for (DeviceId d : plan_devices(plan)) fmt::print("{}", to_text(lower(plan, d)));
    }
  });
}

void add_redistribute(CLI::App& app) {
  struct Args {
    std::string in, out, to, to_mesh, backend, machine;
    bool json = false, quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("redistribute", "Move a sharded folder to new placements (and mesh)");
  cmd->add_option("--in,--input", args->in, "source sharded folder")->required();
  cmd->add_option("--to", args->to, "destination placements, e.g. \"R,S(1)\"")->required();
  cmd->add_option("--to-mesh", args->to_mesh,
                  "destination mesh, e.g. 4@4,5,6,7 (default: the source mesh)");
  cmd->add_option("--out", args->out, "destination sharded folder")->required();
  cmd->add_option("--backend", args->backend,
                  "threads or mpi (default: mpi under mpirun, else threads)");
  cmd->add_option("--machine", args->machine, machine_help(MachineUse::kBuiltIn));
  cmd->add_flag("--json", args->json, "print the plan and timing as JSON");
  cmd->add_flag("--quiet", args->quiet, "print nothing on success (no progress either)");
  cmd->callback([args] {
    RedistributeFolderOptions o{.in = args->in, .out = args->out, .to = parse_placements(args->to)};
    if (!args->to_mesh.empty()) o.to_mesh = parse_mesh(args->to_mesh);
    o.backend = backend_option(args->backend);
    const auto machine = machine_option(args->machine, MachineUse::kBuiltIn, o.backend, 1);
    o.plan.machine = &machine->machine;
    if (!args->quiet && ::isatty(STDERR_FILENO)) {
      o.progress = [](std::string_view stage) { fmt::print(stderr, "redistribute: {}\n", stage); };
    }
    RedistributeFolderResult r = redistribute_folder(o);
    if (!r.reporter || args->quiet) return;
    if (args->json) {
      nlohmann::json j = to_json(r.plan);
      j["seconds"] = r.seconds;
      j["backend"] = to_string(o.backend);
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("{}wrote {} in {:.3f} ms ({} backend)\n", to_text(r.plan), args->out,
                 r.seconds * 1e3, to_string(o.backend));
    }
  });
}

}  // namespace meshflow::cli
