// `meshflow shard` and `meshflow gather`: between one .npy file and a sharded folder.
#include <fmt/format.h>

#include "cli/commands.h"
#include "meshflow/core/npy.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"

namespace meshflow::cli {

void add_shard(CLI::App& app) {
  struct Args {
    std::string input, mesh, placements, out;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("shard", "Split a .npy array over a device mesh into a sharded folder");
  cmd->add_option("--input", args->input, "the .npy array to split")->required();
  cmd->add_option("--mesh", args->mesh, "mesh, e.g. 2x2 or 2x2@4,5,6,7")->required();
  cmd->add_option("--placements", args->placements, "one per mesh dim: S(d) or R, e.g. \"S(0),R\"")
      ->required();
  cmd->add_option("--out", args->out, "output folder (layout.json + rank<i>.npy)")->required();
  cmd->add_flag("--quiet", args->quiet, "print nothing on success");
  cmd->callback([args] {
    Tensor global = read_npy(args->input);
    Layout layout = make_layout(parse_mesh(args->mesh), parse_placements(args->placements),
                                global.shape(), global.dtype());
    write_sharded(args->out, layout, shard_tensor(global, layout));
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
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "gather", "Assemble a sharded folder into one .npy array (reduces Partial, checks replicas)");
  cmd->add_option("--in", args->in, "sharded folder")->required();
  cmd->add_option("--out", args->out, "the .npy file to write")->required();
  cmd->callback([args] {
    ShardedTensor st = read_sharded(args->in);
    write_npy(args->out, assemble(st.layout, st.shards));
  });
}

}  // namespace meshflow::cli
