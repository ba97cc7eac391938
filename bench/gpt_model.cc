#include "bench/gpt_model.h"

#include <fmt/format.h>

#include "bench/make_gpt_script.h"
#include "bench/report.h"
#include "meshflow/core/error.h"

namespace meshflow::bench {

namespace fs = std::filesystem;

void check_gpt_config(const GptConfig& c) {
  if (c.heads < 1 || c.width % c.heads != 0) {
    fail(ErrorKind::kInvalidArgument, "GPT width {} is not a multiple of its {} heads", c.width,
         c.heads);
  }
  if (c.blocks < 1) fail(ErrorKind::kInvalidArgument, "a GPT needs a block, not {}", c.blocks);
}

GptFiles::GptFiles(const GptConfig& c, int devices, const fs::path& data, const std::string& init) {
  check_gpt_config(c);
  std::vector<std::string> words = {"/usr/bin/python3",
                                    "-c",
                                    kMakeGptPy,
                                    folder_.path().string(),
                                    "--batch",
                                    std::to_string(c.batch),
                                    "--seq",
                                    std::to_string(c.seq),
                                    "--vocab",
                                    std::to_string(c.vocab),
                                    "--dim",
                                    std::to_string(c.width),
                                    "--heads",
                                    std::to_string(c.heads),
                                    "--blocks",
                                    std::to_string(c.blocks),
                                    "--devices",
                                    std::to_string(devices),
                                    "--init",
                                    init};
  if (!data.empty()) {
    words.push_back("--data");
    words.push_back(data.string());
  }
  CommandOutput run = run_command(words, {}, /*with_errors=*/true);
  if (run.status != 0) {  // the folder goes with the half-made object
    std::string& out = run.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const auto last_line = out.rfind('\n');
    fail(
        ErrorKind::kInvalidArgument, "writing the bench GPT (make_gpt.py) failed: {}",
        out.empty() ? "no output" : out.substr(last_line == std::string::npos ? 0 : last_line + 1));
  }
}

Model GptFiles::load(std::string_view layout) const { return load_model(path(layout)); }

fs::path GptFiles::path(std::string_view layout) const {
  return folder_.path() / fmt::format("gpt_{}.json", layout);
}

}  // namespace meshflow::bench
