// Golden-text tests: a test builds a text (a plan, a catalogue, the passes' output) and compares
// it with a file checked in beside the test (testdata/). On a difference the new text is written
// to the test's working directory, to review and copy over the golden file once every change in
// it is intended.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "meshflow/core/file.h"

namespace meshflow {

// Returns "" when `got` equals the contents of `golden`; otherwise writes `got` to `actual` (a
// file name, in the working directory) and returns one line naming both, for the test to fail
// with: EXPECT_EQ(golden_mismatch(got, path, "x.actual.txt"), ""). A golden file not written yet
// is a difference too, so that a new test's first run leaves the text to check in.
inline std::string golden_mismatch(const std::string& got, const std::filesystem::path& golden,
                                   const std::string& actual) {
  const bool exists = std::filesystem::exists(golden);
  if (exists && got == read_file(golden)) return "";
  std::ofstream(actual) << got;
  return "the text " + std::string(exists ? "differs from " : "has no golden file ") +
         golden.string() + "; the new text is in " + actual +
         " in the test's working directory (copy it over the golden file once every change in "
         "it is intended)";
}

}  // namespace meshflow
