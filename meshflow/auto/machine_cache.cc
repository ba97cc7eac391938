// The key, the file, and the read-or-measure of machine_cache.h.
#include "meshflow/auto/machine_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "meshflow/auto/calibrate.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"
#include "meshflow/kernels/parallel.h"

namespace meshflow {

namespace {

// Returns /proc/cpuinfo's first "model name" (x86) or "Model" (ARM boards), else "unknown".
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (name != "model name" && name != "Model") continue;
    std::string value = line.substr(colon + 1);
    const std::size_t first = value.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    return value.substr(first);
  }
  return "unknown";
}

// Returns `text` in lower case with every run of other characters than letters and digits one
// '-', none at either end.
std::string slug(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      out += static_cast<char>(std::tolower(u));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "unknown" : out;
}

nlohmann::json key_json(const MachineKey& key) {
  return {{"cpu", key.cpu},
          {"cores", key.cores},
          {"backend", std::string(to_string(key.backend))},
          {"devices", key.devices},
          {"threads_per_device", key.threads_per_device}};
}

// Returns the text the cache holds for `key` where it is trusted; "" with one line through
// `note` where there is a file that is not, and "" where there is none.
std::string trusted_text(const MachineKey& key, const std::filesystem::path& file,
                         const MachineCacheOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return {};
  try {
    const std::string text = read_file(file);
    machine_from_cache_text(text, key, file.string());
    return text;
  } catch (const Error& e) {
    if (options.note) options.note(fmt::format("{}; measuring this machine again", e.what()));
    return {};
  }
}

// Makes `machine`, just measured for `key`, agree with the trusted files of `key`'s kernel
// regime (same_kernel_regime) in `file`'s folder on the kernel rates: a refresh writes its rates
// into them; a first measurement takes theirs. Each change is one line through `note`.
void share_kernel_rates(const MachineKey& key, const std::filesystem::path& file,
                        const MachineCacheOptions& options, MachineModel& machine) {
  const std::filesystem::path folder = file.parent_path();
  for (const MachineKey& other : cached_keys(folder, key.backend)) {
    if (other == key || !same_kernel_regime(other, key)) continue;
    const std::filesystem::path other_file = machine_cache_file(other, folder);
    MachineModel theirs;
    try {
      theirs = machine_from_cache_text(read_file(other_file), other, other_file.string());
    } catch (const Error&) {
      continue;  // gone or rewritten since cached_keys read it: no longer one to agree with
    }
    if (!options.refresh) {
      machine.gemm_gflops = theirs.gemm_gflops;
      machine.elementwise_gbps = theirs.elementwise_gbps;
      if (options.note) {
        options.note(fmt::format("kernel rates from {} (as many cores busy, with as many threads)",
                                 other_file.string()));
      }
      return;
    }
    theirs.gemm_gflops = machine.gemm_gflops;
    theirs.elementwise_gbps = machine.elementwise_gbps;
    try {
      write_file_atomic(other_file, machine_cache_text(other, theirs));
      if (options.note) options.note(fmt::format("kernel rates also into {}", other_file.string()));
    } catch (const Error& e) {
      if (options.note) options.note(fmt::format("not kept: {}", e.what()));
    }
  }
}

// Measures `key` and writes its file: the body of cached_machine where the cache holds nothing
// trusted. Every rank of an mpi job calls it; rank 0 writes.
MachineModel measure_and_write(const MachineKey& key, const std::filesystem::path& file,
                               const MachineCacheOptions& options, bool writes) {
  const auto start = std::chrono::steady_clock::now();
  if (options.note) {
    options.note(
        fmt::format("measuring this machine for the cost model ({}), once: it is kept "
                    "in {}",
                    to_string(key), file.string()));
  }
  MachineModel machine = measure_machine(key, options.calibrations, options.progress);
  if (writes && key.backend == Backend::kThreads) share_kernel_rates(key, file, options, machine);
  if (writes) {
    // A cache that cannot be written costs the next estimate another measurement, nothing more.
    try {
      std::error_code ec;
      std::filesystem::create_directories(file.parent_path(), ec);
      if (ec) fail(ErrorKind::kIo, "{}: {}", file.parent_path().string(), ec.message());
      write_file_atomic(file, machine_cache_text(key, machine));
    } catch (const Error& e) {
      if (options.note) options.note(fmt::format("not kept: {}", e.what()));
    }
  }
  if (options.note) {
    options.note(fmt::format(
        "measured in {:.1f} s",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
  }
  return machine;
}

}  // namespace

MachineKey machine_key(Backend backend, int devices, int threads_per_device) {
  MESHFLOW_CHECK(devices >= 1 && threads_per_device >= 0, "machine_key: {} devices, {} threads",
                 devices, threads_per_device);
  MachineKey key{.cpu = cpu_model_name(), .cores = available_cores(), .backend = backend};
  // Threads share this process's cores; processes the machine's (calibrate's cores).
  if (backend == Backend::kMpi)
    key.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  key.devices = backend == Backend::kThreads
                    ? std::min(devices, kMostMeasuredDevicesPerCore * key.cores)
                    : devices;
  key.threads_per_device = threads_per_device > 0
                               ? threads_per_device
                               : std::max(1, available_cores() / std::max(1, devices));
  return key;
}

bool same_kernel_regime(const MachineKey& a, const MachineKey& b) {
  auto busy = [](const MachineKey& k) {
    return std::min(k.devices * k.threads_per_device, k.cores);
  };
  return a.cpu == b.cpu && a.cores == b.cores && a.backend == b.backend &&
         a.threads_per_device == b.threads_per_device && busy(a) == busy(b);
}

std::string to_string(const MachineKey& key) {
  return fmt::format("{}, {} device{} x {} thread{}, {} core{} of {}", to_string(key.backend),
                     key.devices, key.devices == 1 ? "" : "s", key.threads_per_device,
                     key.threads_per_device == 1 ? "" : "s", key.cores, key.cores == 1 ? "" : "s",
                     key.cpu);
}

std::filesystem::path machine_cache_folder() {
  // The XDG base directory rule: a relative XDG_CACHE_HOME is ignored.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME");
      xdg != nullptr && std::filesystem::path(xdg).is_absolute()) {
    return std::filesystem::path(xdg) / "meshflow";
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    fail(ErrorKind::kIo,
         "no cache folder for this machine's description: neither XDG_CACHE_HOME nor HOME is "
         "set (give --machine FILE or --machine default)");
  }
  return std::filesystem::path(home) / ".cache" / "meshflow";
}

std::filesystem::path machine_cache_file(const MachineKey& key,
                                         const std::filesystem::path& folder) {
  return folder / fmt::format("machine-{}-{}x{}-{}cores-{}.json", to_string(key.backend),
                              key.devices, key.threads_per_device, key.cores, slug(key.cpu));
}

std::vector<MachineKey> cached_keys(const std::filesystem::path& folder, Backend backend) {
  const MachineKey here = machine_key(backend, 1);
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("machine-") && name.ends_with(".json")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<MachineKey> keys;
  for (const std::filesystem::path& file : files) {
    try {
      const std::string text = read_file(file);
      const nlohmann::json j = parse_json(text, file.string());
      MachineKey key = here;
      key.devices = j.at("key").at("devices").get<int>();
      key.threads_per_device = j.at("key").at("threads_per_device").get<int>();
      if (key.devices < 1 || key.threads_per_device < 1) continue;
      machine_from_cache_text(text, key, file.string());  // trusted, and this machine's
      keys.push_back(key);
    } catch (const std::exception&) {
      // Another machine's, or not trusted: not this machine's to refresh.
    }
  }
  return keys;
}

std::string machine_cache_text(const MachineKey& key, const MachineModel& machine) {
  const nlohmann::json j = {{"version", kMachineCacheVersion},
                            {"key", key_json(key)},
                            {"machine", machine_to_json(machine)}};
  return j.dump(2) + "\n";
}

MachineModel machine_from_cache_text(const std::string& text, const MachineKey& key,
                                     const std::string& source) {
  const nlohmann::json json = parse_json(text, source);
  const JsonField root(json, source, ErrorKind::kInvalidArgument);
  const JsonField version = root.member("version");
  if (version.as_int(0, 1 << 30) != kMachineCacheVersion) {
    version.reject(fmt::format("is another version than this build's ({})", kMachineCacheVersion));
  }
  const JsonField stored = root.member("key");
  if (stored.value() != key_json(key)) {
    stored.reject(fmt::format("is not this machine's key ({})", to_string(key)));
  }
  return machine_from_json(root.member("machine").value(), source + ": machine");
}

MachineModel measure_machine(const MachineKey& key, int calibrations,
                             const std::function<void(const std::string&)>& progress) {
  MESHFLOW_CHECK(calibrations >= 1, "measure_machine: {} calibrations", calibrations);
  std::vector<MachineModel> runs;
  for (int k = 0; k < calibrations; ++k) {
    runs.push_back(calibrate({.backend = key.backend,
                              .devices = key.devices,
                              .threads_per_device = key.threads_per_device,
                              .progress = progress}));
  }
  return median_machine(runs);
}

namespace {

// A description from the cache and the file it is kept in (under mpi, the world's key's).
struct CachedMachine {
  MachineModel machine;
  std::filesystem::path file;
};

std::optional<CachedMachine> cached_with_file(const MachineKey& key,
                                              const MachineCacheOptions& options) {
  const std::filesystem::path folder =
      options.folder.empty() ? machine_cache_folder() : options.folder;
  const std::filesystem::path file = machine_cache_file(key, folder);
  if (key.backend == Backend::kThreads || detect_backend() != Backend::kMpi) {
    if (!options.refresh) {
      const std::string text = trusted_text(key, file, options);
      if (!text.empty())
        return CachedMachine{machine_from_cache_text(text, key, file.string()), file};
    }
    // mpi's figures are measured by mpi's processes only (started by mpirun).
    if (key.backend == Backend::kMpi || (!options.measure && !options.refresh)) return std::nullopt;
    return CachedMachine{measure_and_write(key, file, options, /*writes=*/true), file};
  }
  // mpi: the world's processes are measured together, so the key is the world's. Rank 0 reads
  // and decides; every rank gets its verdict, the trusted description's JSON or nothing, so
  // that every rank measures (a collective) or none does.
  const bool rank0 = prints_shared_errors();
  MachineCacheOptions rank_options = options;
  if (!rank0) rank_options.note = rank_options.progress = nullptr;
  MachineKey world_key = key;
  std::string verdict;
  launch({.backend = Backend::kMpi}, [&](Communicator& world) {
    world_key.devices = world.size();
    std::string mine;
    const std::filesystem::path world_file = machine_cache_file(world_key, folder);
    if (world.rank() == 0 && !options.refresh) {
      const std::string text = trusted_text(world_key, world_file, rank_options);
      if (!text.empty()) {
        mine =
            machine_to_json(machine_from_cache_text(text, world_key, world_file.string())).dump();
      }
    }
    verdict = broadcast_string(world, mine, Rank{0});
  });
  const std::filesystem::path world_file = machine_cache_file(world_key, folder);
  if (!verdict.empty())
    return CachedMachine{machine_from_json(nlohmann::json::parse(verdict), world_file.string()),
                         world_file};
  if (!options.measure && !options.refresh) return std::nullopt;
  return CachedMachine{measure_and_write(world_key, world_file, rank_options, rank0), world_file};
}

}  // namespace

std::optional<MachineModel> cached_machine(const MachineKey& key,
                                           const MachineCacheOptions& options) {
  std::optional<CachedMachine> cached = cached_with_file(key, options);
  if (!cached) return std::nullopt;
  return std::move(cached->machine);
}

void note_on_stderr(const std::string& line) {
  fmt::print(stderr, "meshflow: {}\n", line);
  std::fflush(stderr);
}

MachineChoice parse_machine_choice(const std::string& text) {
  if (text.empty()) return {};
  if (text == "default") return {.kind = MachineChoice::Kind::kBuiltIn};
  return {.kind = MachineChoice::Kind::kFile, .file = text};
}

ChosenMachine choose_machine(const MachineChoice& choice, const MachineKey& key,
                             const MachineCacheOptions& options) {
  switch (choice.kind) {
    case MachineChoice::Kind::kBuiltIn:
      return {.machine = default_machine(), .source = "built-in"};
    case MachineChoice::Kind::kFile:
      return {.machine = load_machine(choice.file), .source = choice.file.string()};
    case MachineChoice::Kind::kMeasured:
      break;
  }
  if (std::optional<CachedMachine> cached = cached_with_file(key, options)) {
    return {.machine = std::move(cached->machine),
            .source = fmt::format("measured ({})", cached->file.string())};
  }
  return {.machine = default_machine(), .source = "built-in (no measurement cached)"};
}

}  // namespace meshflow
