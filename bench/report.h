// Benchmark results in the format of docs/contract.md: a table for people, one JSON object for
// scripts.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshflow::bench {

// Timings of one case and of its floor, measured interleaved in the same run.
struct BenchResult {
  std::string case_name;  // "all_gather", "S(0)->R", "copy_box long rows", ...
  std::string backend;    // "threads", "mpi", "host"
  std::string mesh;       // "2x2", or "" where no mesh applies
  int devices = 1;
  std::int64_t bytes = 0;  // global tensor bytes
  std::vector<double> case_s;
  std::vector<double> floor_s;  // empty when the case has no floor
  std::optional<std::string> baseline;
  std::vector<double> baseline_s;                   // timings of the baseline, when there is one
  nlohmann::json extra = nlohmann::json::object();  // case-specific columns (algorithm, busbw)
};

struct BenchReport {
  std::string benchmark;
  bool progress = true;  // add_result may print a line per finished case (on a terminal)
  double memcpy_gbps = 0;
  std::vector<BenchResult> results;
};

// Appends `result` to `report` and, when report.progress is set and standard error is a terminal,
// prints one line saying the case finished (long benchmarks show progress; logs and pipes stay
// clean).
void add_result(BenchReport& report, BenchResult result);

// Prints `line` as add_result prints its own (progress set, standard error a terminal): for a
// benchmark whose cases all finish at its end.
void print_progress(const BenchReport& report, std::string_view line);

// Returns the median of `samples` (the mean of the middle two for an even count); 0 if empty.
double median(std::vector<double> samples);

// Returns the JSON object docs/contract.md specifies.
nlohmann::json to_json(const BenchReport& report);

// Returns an aligned text table with one row per result.
std::string to_table(const BenchReport& report);

// Resets this process's peak resident memory (VmHWM; writing 5 to /proc/self/clear_refs).
void reset_peak_memory();

// Returns a byte count /proc/self/status gives (`field`: "VmHWM:", the peak resident memory
// since the last reset; "VmRSS:", the resident memory now); 0 where it is not there.
std::int64_t status_bytes(const char* field);

// What a command printed on standard output (and standard error, where asked) and its exit
// status (-1 when it could not start).
struct CommandOutput {
  std::string out;
  int status = -1;
  // Returns `out` parsed as JSON when the command exited 0 and printed JSON, else nothing.
  std::optional<nlohmann::json> json() const;
};

// Runs `words` (each quoted for the shell) with `env` ("NAME=value" pairs) set, its standard
// error discarded, or joined to standard output when `with_errors`. The benches' NumPy and
// PyTorch runs and the GPT writer go through it.
CommandOutput run_command(const std::vector<std::string>& words,
                          const std::vector<std::string>& env = {}, bool with_errors = false);

// Returns the seconds `fn` takes, by the steady clock.
double time_once(const std::function<void()>& fn);

// A folder of its own under the temporary folder ("<stem>_<pid>_<n>"), made by the constructor
// and removed with everything in it by the destructor.
class TempFolder {
 public:
  explicit TempFolder(std::string_view stem);
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace meshflow::bench
