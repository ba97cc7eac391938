// `meshflow shard` and `meshflow gather`: between one .npy file and a sharded folder.
#include <fmt/format.h>
#include <unistd.h>

#include "cli/commands.h"
#include "meshflow/mesh/folder_io.h"

namespace meshflow::cli {

namespace {

// Returns a progress printer for `what` on standard error when it is a terminal (and `quiet` is
// off): one line rewritten in place, for tensors large enough to take a while; else nothing.
Progress terminal_progress(const char* what, bool quiet) {
  constexpr std::int64_t kWorthShowing = std::int64_t{64} << 20;
  if (quiet || !::isatty(STDERR_FILENO)) return nullptr;
  return [what](std::int64_t done, std::int64_t total) {
    if (total < kWorthShowing) return;
    fmt::print(stderr, "\r{}: {:3d}% of {} MiB", what, static_cast<int>(100 * done / total),
               total >> 20);
    if (done == total) fmt::print(stderr, "\n");
  };
}

}  // namespace

void add_shard(CLI::App& app) {
  struct Args {
    std::string input, mesh, placements, out;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("shard", "Split a .npy array over a device mesh into a sharded folder");
  cmd->add_option("--in,--input", args->input, "the .npy array to split")->required();
  cmd->add_option("--mesh", args->mesh, "mesh, e.g. 2x2 or 2x2@4,5,6,7")->required();
  cmd->add_option("--placements", args->placements, "one per mesh dim: S(d) or R, e.g. \"S(0),R\"")
      ->required();
  cmd->add_option("--out", args->out, "output folder (layout.json + rank<i>.npy)")->required();
  cmd->add_flag("--quiet", args->quiet, "print nothing on success");
  cmd->callback([args] {
    const Layout layout =
        shard_file(args->input, parse_mesh(args->mesh), parse_placements(args->placements),
                   args->out, terminal_progress("shard", args->quiet));
    if (args->quiet) return;
    fmt::print("{}\n", to_string(layout));
    for (int i = 0; i < size(layout.mesh); ++i) {
      DeviceId d = layout.mesh.devices[i];
      fmt::print("  rank{} device {} box {}\n", i, d, to_string(shard_box(layout, d)));
    }
    fmt::print("wrote {}\n", args->out);
  });
}

void add_gather(CLI::App& app) {
  struct Args {
    std::string in, out;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "gather", "Assemble a sharded folder into one .npy array (reduces Partial, checks replicas)");
  cmd->add_option("--in,--input", args->in, "sharded folder")->required();
  cmd->add_option("--out", args->out, "the .npy file to write")->required();
  cmd->add_flag("--quiet", args->quiet, "print nothing (no progress either)");
  cmd->callback([args] { gather_file(args->in, args->out); });
}

}  // namespace meshflow::cli
