// Runs the `meshflow` binary for CLI tests and captures its exit code and output.
#pragma once

#include <string>

namespace meshflow::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // standard output
  std::string err;  // standard error
};

// Runs `meshflow ARGS` through the shell (ARGS is shell text) and returns what it did.
CommandResult run_meshflow(const std::string& args);

// Returns a fresh empty folder under the system temporary folder named after `tag`.
std::string fresh_dir(const std::string& tag);

}  // namespace meshflow::testing
