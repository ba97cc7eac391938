// `meshflow checkpoint DIR [--verify] [--json]`: the complete checkpoints in DIR, each with its
// tensors, and with --verify every file checked against its sha256.
#include <fmt/format.h>

#include "cli/commands.h"
#include "meshflow/core/error.h"
#include "meshflow/train/checkpoint.h"

namespace meshflow::cli {

void add_checkpoint(CLI::App& app) {
  struct Args {
    std::string dir;
    bool verify = false, json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "checkpoint",
      "List the complete checkpoints `train --checkpoint DIR` wrote, and verify them");
  cmd->add_option("dir", args->dir, "the checkpoint folder (train --checkpoint DIR)")->required();
  cmd->add_flag("--verify", args->verify,
                "check every file against its sha256, naming each damaged one (exit 1 if any)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args] {
    const nlohmann::json list = list_checkpoints(args->dir, false);
    std::vector<std::string> damaged;
    nlohmann::json out = list;
    if (args->verify) {
      for (nlohmann::json& c : out["checkpoints"]) {
        const std::vector<std::string> bad =
            damaged_files(read_checkpoint(c["path"].get<std::string>()));
        c["verified"] = bad.empty();
        damaged.insert(damaged.end(), bad.begin(), bad.end());
      }
    }
    if (args->json) {
      fmt::print("{}\n", out.dump(2));
    } else {
      if (out["checkpoints"].empty()) fmt::print("no complete checkpoint in {}\n", args->dir);
      for (const nlohmann::json& c : out["checkpoints"]) {
        const std::string verified =
            c["verified"].is_null() ? "" : (c["verified"].get<bool>() ? "  verified" : "  DAMAGED");
        fmt::print("step {}  {}  {} bytes  {} tensors{}\n", c["step"].get<int>(),
                   c["path"].get<std::string>(), c["bytes"].get<std::int64_t>(),
                   c["tensors"].size(), verified);
      }
    }
    // Each damaged file on a line of its own, then the one error line (exit 1).
    for (std::size_t i = 1; i < damaged.size(); ++i)
      fmt::print(stderr, "meshflow: damaged: {}\n", damaged[i]);
    if (!damaged.empty()) {
      fail(ErrorKind::kIo, "{} damaged file{} in {}, the first: {}", damaged.size(),
           damaged.size() == 1 ? "" : "s", args->dir, damaged.front());
    }
  });
}

}  // namespace meshflow::cli
