#include "meshflow/kernels/parallel.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "meshflow/core/error.h"
#include "meshflow/kernels/float_mode.h"

namespace meshflow {

namespace {

thread_local ThreadTeam* current_team = nullptr;

// Returns once done() holds or kTeamWatch has passed: watching, pausing between looks and
// yielding the core every 64 looks.
template <class Done>
void watch_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kTeamWatch;
  for (unsigned look = 1; !done(); ++look) {
    if (look % 64 != 0) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (std::chrono::steady_clock::now() > until) return;
    std::this_thread::yield();
  }
}

}  // namespace

ThreadTeam::ThreadTeam(int threads) {
  MESHFLOW_CHECK(threads >= 1);
  helpers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { helper(i); });
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ThreadTeam::helper(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* body = nullptr;
    unsigned mode = 0;
    watch_until([&] { return stopping_.load() || generation_.load() != seen; });
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (index >= parts_) continue;  // not needed this time
      body = body_;
      mode = float_mode_;
    }
    set_float_mode(mode);
    std::exception_ptr error;
    try {
      (*body)(index);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(mu_);
    if (error && !error_) error_ = error;
    if (--running_ == 0) done_.notify_one();
  }
}

void ThreadTeam::run(int parts, const std::function<void(int part)>& body) {
  MESHFLOW_CHECK(parts >= 1 && parts <= size());
  if (parts > 1) {
    {
      std::lock_guard lock(mu_);
      body_ = &body;
      float_mode_ = float_mode();
      parts_ = parts;
      running_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
  }
  std::exception_ptr error;
  {
    // The caller's part runs without the team: a kernel inside it runs alone.
    const UseTeam alone(nullptr);
    try {
      body(0);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (parts > 1) {
    watch_until([&] { return running_.load() == 0; });
    std::unique_lock lock(mu_);  // also orders the helpers' writes before the caller's reads
    done_.wait(lock, [&] { return running_ == 0; });
    if (!error) error = error_;
    body_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

UseTeam::UseTeam(ThreadTeam* team) : saved_(current_team) { current_team = team; }

UseTeam::~UseTeam() { current_team = saved_; }

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int team_threads() { return current_team ? current_team->size() : 1; }

int parallel_parts(std::int64_t n, std::int64_t grain) {
  const std::int64_t by_grain = n / std::max<std::int64_t>(1, grain);
  return static_cast<int>(std::clamp<std::int64_t>(by_grain, 1, team_threads()));
}

std::int64_t part_begin(std::int64_t n, int parts, int p, std::int64_t align) {
  if (p >= parts) return n;
  const std::int64_t at = n * p / parts;
  return std::min(n, at / align * align);
}

void parallel_parts_for(
    std::int64_t n, int parts,
    const std::function<void(int part, std::int64_t begin, std::int64_t end)>& body) {
  MESHFLOW_CHECK(parts >= 1 && parts <= team_threads());
  if (parts == 1) {
    body(0, 0, n);
    return;
  }
  // Boundaries on whole vectors of 16 floats where the parts are long enough to afford it.
  const std::int64_t align = n >= 64 * parts ? 16 : 1;
  current_team->run(parts, [&](int p) {
    const std::int64_t begin = part_begin(n, parts, p, align);
    const std::int64_t end = part_begin(n, parts, p + 1, align);
    body(p, begin, end);
  });
}

void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  parallel_parts_for(n, parallel_parts(n, grain),
                     [&](int, std::int64_t begin, std::int64_t end) { body(begin, end); });
}

}  // namespace meshflow
