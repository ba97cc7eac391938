// The threads of one device. A device that owns more than one core (train --threads-per-device)
// runs each kernel split over a team: the device's own thread plus helpers that watch for the
// next kernel a while (kTeamWatch), then sleep. The runtime gives a device thread its team
// (UseTeam) for the length of a run; a kernel asks for it with parallel_for, which splits a range
// into contiguous parts, one per thread. Outside a UseTeam, and inside a part (no nesting),
// parallel_for runs on the calling thread alone, so a kernel is correct with or without a team
// and equal to itself: every part computes what the whole loop would for its elements
// (reductions combine per-part sums in part order, so a team of n threads gives the same bits on
// every run).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace meshflow {

// Elements below which an elementwise loop is not worth waking a helper for (waking one costs
// microseconds; 64 Ki floats take about as long to stream).
constexpr std::int64_t kElementGrain = std::int64_t{1} << 16;

// Returns the rows of `width` elements a part takes at least: kElementGrain elements' worth.
inline std::int64_t row_grain(std::int64_t width) {
  return std::max<std::int64_t>(1, kElementGrain / std::max<std::int64_t>(1, width));
}

// Returns the columns of `rows` rows a part takes at least, when parts split the columns and
// each streams its columns of every row: kElementGrain elements' worth, and whole vectors.
inline std::int64_t column_grain(std::int64_t rows) {
  return std::max<std::int64_t>(16, row_grain(rows));
}

// How long a team's thread watches for the other side before it sleeps: a helper for the next
// run, the caller for its helpers' parts (OpenMP's active wait, bounded). A kernel's parallel
// loops come one after another, and a thread asleep took 20-30 us to wake on this machine: an
// empty run on two threads, which wakes a helper and then the caller, took 47-54 us asleep and
// 1.3 us watching; the bench GPT's layer norm on two threads went from 118 to 56 us. A watching
// thread yields its core to any other thread that wants it every 64 looks.
constexpr std::chrono::microseconds kTeamWatch{200};

// A device's threads: the thread that calls run plus size() - 1 helpers it owns.
class ThreadTeam {
 public:
  explicit ThreadTeam(int threads);  // threads >= 1
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls body(p) for every p in [0, parts), parts <= size(): part 0 on the calling thread, the
  // others on helpers in the caller's floating-point mode (denormals flushed where the caller
  // flushes them); returns when all have returned, rethrowing the first exception. One caller
  // at a time.
  void run(int parts, const std::function<void(int part)>& body);

 private:
  void helper(int index);

  std::vector<std::thread> helpers_;
  // Every field changes under mu_; the atomics are also read without it, by a watching thread,
  // which then takes mu_ before it reads anything else.
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* body_ = nullptr;
  unsigned float_mode_ = 0;  // the caller's (kernels/float_mode.h), set on each helper
  int parts_ = 0;
  std::atomic<std::uint64_t> generation_ = 0;
  std::atomic<int> running_ = 0;  // helpers still in this generation's parts
  std::atomic<bool> stopping_ = false;
  std::exception_ptr error_;
};

// While alive, kernels called on this thread split their work over `team` (null: none).
class UseTeam {
 public:
  explicit UseTeam(ThreadTeam* team);
  ~UseTeam();
  UseTeam(const UseTeam&) = delete;
  UseTeam& operator=(const UseTeam&) = delete;

 private:
  ThreadTeam* saved_;
};

// Returns the CPUs this process may run on (its affinity mask), at least 1.
int available_cores();

// Returns the threads a kernel called on this thread may use: its team's size, else 1.
int team_threads();

// Returns how many parts parallel_for splits n elements into: team_threads(), fewer where a
// part would hold under `grain` elements, at least 1.
int parallel_parts(std::int64_t n, std::int64_t grain);

// Returns the first element of part p of n elements split into `parts` (p = parts gives n):
// equal parts, each boundary a multiple of `align` where it is not n.
std::int64_t part_begin(std::int64_t n, int parts, int p, std::int64_t align = 16);

// Calls body(begin, end) on parallel_parts(n, grain) contiguous parts covering [0, n), on the
// team's threads; returns when all have run, rethrowing the first exception.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

// Calls body(part, begin, end) as parallel_for does, with the part's index (for per-part
// scratch or partial sums), on exactly `parts` parts (parts <= team_threads()).
void parallel_parts_for(
    std::int64_t n, int parts,
    const std::function<void(int part, std::int64_t begin, std::int64_t end)>& body);

}  // namespace meshflow
