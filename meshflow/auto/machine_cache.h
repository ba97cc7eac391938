// This machine's description for the cost model where no `--machine` is given: measured by
// calibrate (calibrate.h) the first time an estimate needs it, kept in the user's cache folder
// ($XDG_CACHE_HOME/meshflow/, else ~/.cache/meshflow/) under a key of what changes the figures
// (the processor, its cores, the backend, the devices and their threads), and reused after.
//
// Invariants of the cache:
//   - a file is trusted only where its version is kMachineCacheVersion and its key is the key
//     asked for; anything else (unreadable, malformed, another version, another key) is measured
//     over, with one line through `note`;
//   - a file is written whole (write_file_atomic), so a reader sees the old one or the new one;
//   - under mpi world rank 0 alone reads and writes, and every rank returns the figures rank 0
//     read or the measurement every rank took part in: the same on every rank;
//   - threads' trusted files of one kernel regime (same_kernel_regime) hold the same kernel
//     rates: a key measured where such a file is trusted takes them from it, and a refresh
//     writes its own into every such file. (mpi's keys keep their own: one world size a job.)
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/comm/backend.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow {

// The version of the cache files this build writes and trusts.
inline constexpr int kMachineCacheVersion = 3;

// More devices than this many a core are measured as this many a core: their kernels take turns
// on the cores (which the cost model's core_sharing prices), and measuring them all at once
// would take minutes and each device's probes' memory (64 device threads on 2 cores: over 75 s).
inline constexpr int kMostMeasuredDevicesPerCore = 4;

// What changes a description's figures.
struct MachineKey {
  std::string cpu;  // the processor's model name ("unknown" where the system names none)
  int cores = 1;    // the cores this process may run on
  Backend backend = Backend::kThreads;
  int devices = 1;             // devices measured at once
  int threads_per_device = 1;  // threads each computes with
  bool operator==(const MachineKey&) const = default;
};

// Returns the key of `devices` devices computing with `threads_per_device` threads each (0: the
// default, cores / devices, at least 1) on `backend` on this machine, devices capped at
// kMostMeasuredDevicesPerCore a core.
MachineKey machine_key(Backend backend, int devices, int threads_per_device = 0);

// Whether `a` and `b` measure the same kernel rates: the same processor, cores, backend and
// threads a device, and as many cores busy (devices x threads, at most the cores). Their rates
// are per core (calibrate divides by core_sharing), so 2 and 4 one-thread devices on 2 cores
// share them, and the cache keeps one pair for them (cached_machine) so that their estimates
// compare; 1 and 2 devices on 2 cores, or 1 and 2 threads a device, do not.
bool same_kernel_regime(const MachineKey& a, const MachineKey& b);

// Returns "threads, 2 devices x 1 thread, 2 cores of Intel(R) Xeon(R) Processor".
std::string to_string(const MachineKey& key);

// Returns $XDG_CACHE_HOME/meshflow where XDG_CACHE_HOME is set to an absolute path, else
// $HOME/.cache/meshflow; throws Error(kIo) where neither is set.
std::filesystem::path machine_cache_folder();

// Returns key's file in `folder`: "machine-threads-2x1-2cores-intel-r-xeon-r-processor.json".
std::filesystem::path machine_cache_file(const MachineKey& key,
                                         const std::filesystem::path& folder);

// Returns the keys of the trusted files in `folder` that are this machine's (its processor and
// cores) on `backend`, in file-name order.
std::vector<MachineKey> cached_keys(const std::filesystem::path& folder, Backend backend);

// Returns the cache file's text for `key`, {"version", "key", "machine"}, and the description
// it holds (throws Error(kInvalidArgument) naming `source` and the field where `json` is not
// one for `key` of this version).
std::string machine_cache_text(const MachineKey& key, const MachineModel& machine);
MachineModel machine_from_cache_text(const std::string& text, const MachineKey& key,
                                     const std::string& source);

// Returns the median (median_machine) of `calibrations` calibrations of key's devices, taken in
// turns; `progress` as CalibrateOptions'.
MachineModel measure_machine(const MachineKey& key, int calibrations,
                             const std::function<void(const std::string&)>& progress = {});

struct MachineCacheOptions {
  std::filesystem::path folder;  // empty: machine_cache_folder()
  // Measure where the cache holds no trusted file (else return nullopt and write nothing).
  bool measure = true;
  bool refresh = false;  // measure and write even where the cache holds a trusted file
  int calibrations = 3;  // measure: their median, so that one slow spell moves no rate
  // Called on the reporting device with one line: that it measures (and where it keeps the
  // result), that a file is not trusted and why, how long the measurement took.
  std::function<void(const std::string&)> note;
  // Called with calibrate's line per finished measurement (meshflow calibrate's progress).
  std::function<void(const std::string&)> progress;
};

// Returns key's description from the cache, measured and written first where the cache holds
// no trusted file (or options.refresh); nullopt where it holds none and !options.measure, and
// for an mpi key outside mpirun where it holds none (only mpi's processes measure mpi). Under
// mpirun every rank must call it, and the key's devices are the world's (its processes are
// measured together).
std::optional<MachineModel> cached_machine(const MachineKey& key,
                                           const MachineCacheOptions& options = {});

// Writes "meshflow: LINE" to standard error: the command line's and Python's `note`.
void note_on_stderr(const std::string& line);

// What `--machine` (Python's machine=) names: this machine's measured description (not given),
// the built-in one ("default") or a description file.
struct MachineChoice {
  enum class Kind { kMeasured, kBuiltIn, kFile };
  Kind kind = Kind::kMeasured;
  std::filesystem::path file;
};
MachineChoice parse_machine_choice(const std::string& text);

// The description an estimate prices with, and which one it is: "measured (FILE)", "built-in"
// or the file given.
struct ChosenMachine {
  MachineModel machine;
  std::string source;
};

// Returns the description `choice` names for `key`: the file's, the built-in one, or the cached
// measurement (cached_machine with `options`; where that holds none and measures none, the
// built-in one). Under mpi every rank must call it.
ChosenMachine choose_machine(const MachineChoice& choice, const MachineKey& key,
                             const MachineCacheOptions& options = {});

}  // namespace meshflow
