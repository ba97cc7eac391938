// The MPI launcher. Every world rank first settles the launch's agreement (one small all-gather
// on MPI_COMM_WORLD, before any sub-communicator exists): ranks started with different
// arguments or files, or a rank that failed while preparing, make every rank fail with the same
// line instead of waiting forever in mismatched collectives. Then each listed device runs fn;
// one that throws prints its error and calls MPI_Abort, so its peers never wait for it, and a
// blocking call that outlives its timeout ends the job through the watchdog.
#include "meshflow/comm/mpi/launch.h"

#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "meshflow/comm/mpi/communicator.h"
#include "meshflow/core/error.h"

namespace meshflow::mpi {

namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Open MPI's reductions malloc a scratch buffer as large as the message on every call, and
// glibc maps a buffer that large afresh and unmaps it on free, so every call faults its pages in
// again: on the reference machine all_reduce of 256 MiB on 2 ranks took 684 ms, reduce_scatter
// 1706 ms (bench collectives). Served from the heap and kept there after free, the same buffers
// are reused: 46 ms and 57 ms. A meshflow MPI process therefore keeps the memory it freed for
// its next allocations, as the threads backend's tensors do (core/tensor.cc).
void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  keep_freed_memory();
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(finalize_at_exit);
}

constexpr std::string_view kErrorPrefix = "error: ";

std::string agreement_text(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string text;
  for (const auto& [name, value] : fields) text += name + "\x1f" + value + "\x1e";
  return text;
}

std::vector<std::pair<std::string, std::string>> agreement_fields(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t unit = text.find('\x1f', pos);
    const std::size_t record = text.find('\x1e', unit);
    out.emplace_back(text.substr(pos, unit - pos), text.substr(unit + 1, record - unit - 1));
    pos = record + 1;
  }
  return out;
}

// Returns the first line of `value`, cut to a readable length, for messages.
std::string short_value(const std::string& value) {
  constexpr std::size_t kShown = 60;
  std::string line = value.substr(0, value.find('\n'));
  if (line.size() > kShown) line = line.substr(0, kShown) + "...";
  if (line.size() < value.size() && line.find("...") == std::string::npos) line += " ...";
  return line;
}

// Returns every rank's agreement text (gathered with MPI_Allgatherv).
std::vector<std::string> gather_texts(const std::string& mine, int size, Watchdog& dog,
                                      Timeout timeout) {
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), displs(size, 0);
  {
    Watchdog::Armed armed(dog, "the agreement of every rank", timeout);
    MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  }
  for (int r = 1; r < size; ++r) displs[r] = displs[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(displs[size - 1] + lengths[size - 1]), '\0');
  {
    Watchdog::Armed armed(dog, "the agreement of every rank", timeout);
    MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(),
                   MPI_CHAR, MPI_COMM_WORLD);
  }
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(displs[r], lengths[r]));
  return out;
}

// Settles `fields` across the world: returns when every rank holds the same ones and none
// carries an error; otherwise throws, on every rank, one Error naming the first failure or
// difference.
void agree(const std::vector<std::pair<std::string, std::string>>& fields, int size, Watchdog& dog,
           Timeout timeout) {
  const std::string mine = agreement_text(fields);
  bool failed = false;
  for (const auto& f : fields) failed = failed || f.second.rfind(kErrorPrefix, 0) == 0;
  const unsigned long long summary[2] = {std::hash<std::string>{}(mine), failed ? 1ull : 0ull};
  std::vector<unsigned long long> all(2 * static_cast<std::size_t>(size));
  {
    Watchdog::Armed armed(dog, "the agreement of every rank", timeout);
    MPI_Allgather(summary, 2, MPI_UNSIGNED_LONG_LONG, all.data(), 2, MPI_UNSIGNED_LONG_LONG,
                  MPI_COMM_WORLD);
  }
  bool same = true;
  for (int r = 0; r < size; ++r) {
    same = same && all[2 * r] == all[0] && all[2 * r + 1] == 0;
  }
  if (same) return;
  // Rare path: every rank learns every rank's fields and derives the same message.
  const std::vector<std::string> texts = gather_texts(mine, size, dog, timeout);
  std::vector<std::vector<std::pair<std::string, std::string>>> per(size);
  for (int r = 0; r < size; ++r) per[r] = agreement_fields(texts[r]);
  for (int r = 0; r < size; ++r) {
    for (const auto& [name, value] : per[r]) {
      if (value.rfind(kErrorPrefix, 0) == 0) {
        throw Error(ErrorKind::kInvalidArgument,
                    fmt::format("device {}: {}", r, value.substr(kErrorPrefix.size())),
                    ErrorScope::kEveryDevice);
      }
    }
  }
  for (int r = 1; r < size; ++r) {
    const std::size_t n = std::max(per[0].size(), per[r].size());
    for (std::size_t i = 0; i < n; ++i) {
      const auto a = i < per[0].size() ? per[0][i] : std::pair<std::string, std::string>{};
      const auto b = i < per[r].size() ? per[r][i] : std::pair<std::string, std::string>{};
      if (a == b) continue;
      const std::string name = a.first.empty() ? b.first : a.first;
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("mpi ranks disagree on {} before the first collective: rank 0 has "
                              "\"{}\" but rank {} has \"{}\" (start every rank with the same "
                              "arguments and files)",
                              name, short_value(a.second), r, short_value(b.second)),
                  ErrorScope::kEveryDevice);
    }
  }
}

}  // namespace

int world_rank() {
  ensure_initialized();
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  ensure_initialized();
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void check_in_world(const std::vector<DeviceId>& devices) {
  const int size = world_size();
  for (DeviceId d : devices) {
    if (d < 0 || d >= size) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("device {} is needed but mpirun started {} processes (devices 0..{})",
                              d, size, size - 1),
                  ErrorScope::kEveryDevice);
    }
  }
}

void launch(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  const int size = world_size(), rank = world_rank();
  Watchdog dog(rank);
  agree(options.agreement, size, dog, options.timeout);
  // Every rank holds the same options now, so these checks fail on every rank alike.
  std::vector<DeviceId> devices = options.devices;
  if (devices.empty()) devices = first_devices(size);
  check_in_world(devices);
  std::vector<DeviceId> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: a device is listed twice", describe("launch", devices)),
                ErrorScope::kEveryDevice);
  }
  if (std::find(devices.begin(), devices.end(), rank) == devices.end()) return;  // spare rank
  ProcessContext context{devices, options.timeout, &dog, {}};
  try {
    auto comm = make_world_communicator(context);
    fn(*comm);
    context.groups.clear();
  } catch (const Error& e) {
    std::fprintf(stderr, "meshflow: error: device %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_status(e.kind()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshflow: error: device %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_status(ErrorKind::kInternal));
  }
}

}  // namespace meshflow::mpi
