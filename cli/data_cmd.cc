// `meshflow data batches`: what `train` feeds, written out for inspection (DESIGN.md "Data,
// evaluation and tokenizers").
#include <fmt/format.h>

#include <charconv>

#include "cli/commands.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/train/data_feed.h"

namespace meshflow::cli {

namespace {

// Returns A and B of "A:B" (or "A" alone: A and A), each >= 1 and A <= B.
std::pair<int, int> step_range(const std::string& text) {
  auto number = [&](std::string_view part) {
    int v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || end != part.data() + part.size() || v < 1)
      fail(ErrorKind::kInvalidArgument, "--steps \"{}\" is not A:B with 1 <= A <= B", text);
    return v;
  };
  const std::size_t colon = text.find(':');
  const std::string_view all(text);
  const int a = number(all.substr(0, colon));
  const int b = colon == std::string::npos ? a : number(all.substr(colon + 1));
  if (b < a) fail(ErrorKind::kInvalidArgument, "--steps \"{}\" is not A:B with 1 <= A <= B", text);
  return {a, b};
}

}  // namespace

void add_data(CLI::App& app) {
  CLI::App* group = app.add_subcommand("data", "Datasets: the batches train feeds");
  group->require_subcommand(1);
  struct Args {
    std::string model, split = "train", steps = "1:1", out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = group->add_subcommand(
      "batches", "Write the global batch train feeds at each step as DIR/step-<t>/<input>.npy");
  cmd->add_option("model", args->model, "the model file (JSON) with a \"data\" object")->required();
  cmd->add_option("--split", args->split, "train, or val (step t: eval batch t - 1)")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--steps", args->steps, "the steps A:B to write")->capture_default_str();
  cmd->add_option("--out", args->out, "the folder to write")->required();
  cmd->callback([args] {
    // Under mpirun one process writes the folder (every rank would read the same files).
    if (detect_backend() == Backend::kMpi && !prints_shared_errors()) return;
    const auto [first, last] = step_range(args->steps);
    const Model model = load_model(args->model);
    const std::optional<ModelData> data = read_model_data(model);
    if (!data) {
      fail(ErrorKind::kInvalidArgument, "{}: the model has no \"data\" object to read batches of",
           args->model);
    }
    write_batches(*data, args->split == "val", first, last, args->out);
    fmt::print("wrote steps {} to {} of the {} split in {}\n", first, last, args->split, args->out);
  });
}

}  // namespace meshflow::cli
