// CLI test helpers.
#include "tests/cli_runner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace meshflow::testing {

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

CommandResult run_meshflow(const std::string& args) {
  const std::string base = fresh_dir("cli_run");
  const std::string cmd =
      std::string(MESHFLOW_BINARY) + " " + args + " >" + base + "/out 2>" + base + "/err";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + "/out");
  r.err = slurp(base + "/err");
  std::filesystem::remove_all(base);
  return r;
}

std::string fresh_dir(const std::string& tag) {
  static int counter = 0;
  auto dir =
      std::filesystem::temp_directory_path() /
      ("meshflow_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace meshflow::testing
