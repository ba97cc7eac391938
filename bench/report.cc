// Benchmark statistics and output.
#include "bench/report.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>

namespace meshflow::bench {

double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

namespace {

nlohmann::json ratio_or_null(double num, double den) {
  return den > 0 ? nlohmann::json(num / den) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json to_json(const BenchReport& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const BenchResult& r : report.results) {
    const double med = median(r.case_s);
    const double floor = median(r.floor_s);
    nlohmann::json j = {
        {"case", r.case_name},
        {"backend", r.backend},
        {"mesh", r.mesh},
        {"devices", r.devices},
        {"bytes", r.bytes > 0 ? nlohmann::json(r.bytes) : nlohmann::json(nullptr)},
        {"median_s", med},
        {"min_s", r.case_s.empty() ? 0 : *std::min_element(r.case_s.begin(), r.case_s.end())},
        {"max_s", r.case_s.empty() ? 0 : *std::max_element(r.case_s.begin(), r.case_s.end())},
        {"floor_s", r.floor_s.empty() ? nlohmann::json(nullptr) : nlohmann::json(floor)},
        {"vs_floor", r.floor_s.empty() ? nlohmann::json(nullptr) : ratio_or_null(med, floor)},
        {"baseline", r.baseline ? nlohmann::json(*r.baseline) : nlohmann::json(nullptr)},
        {"vs_baseline",
         r.baseline ? ratio_or_null(med, median(r.baseline_s)) : nlohmann::json(nullptr)},
    };
    for (auto it = r.extra.begin(); it != r.extra.end(); ++it) j[it.key()] = it.value();
    results.push_back(std::move(j));
  }
  return {
      {"benchmark", report.benchmark}, {"memcpy_gbps", report.memcpy_gbps}, {"results", results}};
}

namespace {

// A case whose max - min exceeds this fraction of its median makes the table warn.
constexpr double kNoisySpread = 0.2;

std::string human_bytes(std::int64_t b) {
  if (b >= (1 << 30) && b % (1 << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1 << 20)) return fmt::format("{:.4g} MiB", b / double(1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.4g} KiB", b / double(1 << 10));
  return fmt::format("{} B", b);
}

std::string human_seconds(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.2f} us", s * 1e6);
}

}  // namespace

std::string to_table(const BenchReport& report) {
  std::string out = fmt::format("benchmark {}  (memcpy here: {:.2f} GB/s)\n", report.benchmark,
                                report.memcpy_gbps);
  out += fmt::format("{:<22} {:<8} {:<9} {:>10} {:>11} {:>21} {:>11} {:>8} {:>14} {}\n", "case",
                     "backend", "mesh", "bytes", "median", "spread (min-max)", "floor", "vs_floor",
                     "vs_baseline", "notes");
  bool noisy = false;
  for (const BenchResult& r : report.results) {
    const double med = median(r.case_s);
    const double floor = median(r.floor_s);
    const double lo = r.case_s.empty() ? 0 : *std::min_element(r.case_s.begin(), r.case_s.end());
    const double hi = r.case_s.empty() ? 0 : *std::max_element(r.case_s.begin(), r.case_s.end());
    noisy = noisy || (med > 0 && (hi - lo) / med > kNoisySpread);
    std::string notes;
    for (auto it = r.extra.begin(); it != r.extra.end(); ++it) {
      notes +=
          fmt::format("{}={} ", it.key(),
                      it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
    }
    out += fmt::format(
        "{:<22} {:<8} {:<9} {:>10} {:>11} {:>21} {:>11} {:>8} {:>14} {}\n", r.case_name, r.backend,
        r.mesh.empty() ? "-" : r.mesh, r.bytes > 0 ? human_bytes(r.bytes) : "-", human_seconds(med),
        fmt::format("{}-{}", human_seconds(lo), human_seconds(hi)),
        r.floor_s.empty() ? "-" : human_seconds(floor),
        r.floor_s.empty() || floor <= 0 ? "-" : fmt::format("{:.2f}x", med / floor),
        r.baseline ? fmt::format("{:.2f}x {}", med / median(r.baseline_s), *r.baseline) : "-",
        notes);
  }
  out +=
      "floor: the same bytes moved by plain memcpy on the same threads (under mpi: by the raw "
      "MPI collective in contiguous blocks), interleaved with the case (vs_floor near 1: nothing "
      "on top of the hardware; below 1: the case writes past the cache with streaming stores, "
      "which memcpy does not); baseline: the named other implementation of the same work, "
      "interleaved too.\n";
  if (noisy) {
    out += fmt::format(
        "warning: some cases spread by more than {:.0f}% of their median: this machine is busy or "
        "has fewer cores than device threads; compare ratios from one run only.\n",
        kNoisySpread * 100);
  }
  return out;
}

void print_progress(const BenchReport& report, std::string_view line) {
  if (report.progress && ::isatty(STDERR_FILENO))
    fmt::print(stderr, "  {} {}\n", report.benchmark, line);
}

void add_result(BenchReport& report, BenchResult result) {
  print_progress(report, fmt::format("{}{}: {} median", result.case_name,
                                     result.bytes > 0 ? " " + human_bytes(result.bytes) : "",
                                     human_seconds(median(result.case_s))));
  report.results.push_back(std::move(result));
}

double time_once(const std::function<void()>& fn) {
  auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TempFolder::TempFolder(std::string_view stem) {
  static std::atomic<int> count{0};
  path_ =
      std::filesystem::temp_directory_path() / fmt::format("{}_{}_{}", stem, ::getpid(), count++);
  std::filesystem::create_directories(path_);
}

TempFolder::~TempFolder() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void reset_peak_memory() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string key = field;
  while (std::getline(status, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return 0;
}

namespace {

// Returns `word` in single quotes for the shell (a quote inside closes, escapes and reopens).
std::string quoted(const std::string& word) {
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::optional<nlohmann::json> CommandOutput::json() const {
  if (status != 0) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

CommandOutput run_command(const std::vector<std::string>& words,
                          const std::vector<std::string>& env, bool with_errors) {
  std::string cmd;
  for (const std::string& e : env) cmd += e + " ";
  for (const std::string& w : words) cmd += quoted(w) + " ";
  cmd += with_errors ? "2>&1" : "2>/dev/null";
  CommandOutput r;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe)) r.out += buf.data();
  const int raw = ::pclose(pipe);
  r.status = raw == -1 ? -1 : WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

}  // namespace meshflow::bench
