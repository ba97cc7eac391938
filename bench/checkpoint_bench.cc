// The checkpoint benchmark. Every timing is the slowest device's, from a barrier to a barrier,
// on the threads backend. Loads, their io floor and NumPy's np.load read from the disk (the
// files evicted from the page cache first), as a resume after a crash does. Peak memory is the
// process's VmHWM after resetting it (writing 5 to /proc/self/clear_refs) just before the case,
// less its resident memory then.
#include "bench/checkpoint_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "bench/collectives_bench.h"
#include "bench/gpt_model.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/core/sha256.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/mesh/folder_io.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/train/checkpoint.h"
#include "meshflow/train/trainer.h"

namespace meshflow::bench {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kCols = 4096;
constexpr int kDevices = 4;
constexpr std::int64_t kSlab = std::int64_t{8} << 20;

// NumPy's side: np.save of every shard (save) or np.load of every file (load), timed inside.
constexpr const char* kNumpyScript = R"(
import glob, json, sys, time
import numpy as np
mode, folder, rows, cols, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if mode == "save":
    shards = [np.random.default_rng(i).random((rows, cols), dtype=np.float32) for i in range(count)]
    start = time.perf_counter()
    for i, s in enumerate(shards):
        np.save(f"{folder}/shard{i}.npy", s)
else:
    files = sorted(glob.glob(f"{folder}/shard*.npy"))
    start = time.perf_counter()
    loaded = [np.load(f) for f in files]
print(json.dumps({"seconds": time.perf_counter() - start}))
)";

std::optional<double> numpy_seconds(const CheckpointBenchOptions& o, const fs::path& script,
                                    const char* mode, const fs::path& folder, std::int64_t rows,
                                    int count) {
  const std::optional<nlohmann::json> j =
      run_command({o.python.string(), script.string(), mode, folder.string(), std::to_string(rows),
                   std::to_string(kCols), std::to_string(count)})
          .json();
  if (!j || !j->contains("seconds")) return std::nullopt;
  return j->at("seconds").get<double>();
}

struct State {
  std::vector<SavedTensor> tensors;         // names and save layouts (shards filled per device)
  std::vector<std::vector<Tensor>> shards;  // per device, per tensor
  std::vector<Layout> load_layouts;         // per tensor: where a resume puts it
  std::int64_t bytes = 0;
};

State make_state(std::int64_t bytes) {
  State s;
  const DeviceMesh mesh = parse_mesh("2x2");
  // Two weights and their AdamW states: six tensors of equal rows.
  const std::int64_t rows = std::max<std::int64_t>(2, (bytes / 6 / (kCols * 4) + 1) / 2 * 2);
  for (const std::string w : {"w1", "w2"}) {
    for (const std::string suffix : {"", ".exp_avg", ".exp_avg_sq"}) {
      const Shape shape = {rows, kCols};
      s.tensors.push_back({w + suffix, make_layout(mesh, parse_placements("S(0),S(1)"), shape)});
      s.load_layouts.push_back(make_layout(mesh, parse_placements("S(1),S(0)"), shape));
      s.bytes += rows * kCols * 4;
    }
  }
  s.shards.resize(kDevices);
  for (int d = 0; d < kDevices; ++d)
    for (std::size_t t = 0; t < s.tensors.size(); ++t)
      s.shards[static_cast<std::size_t>(d)].push_back(
          random_tensor(DType::kFloat32, local_shape(s.tensors[t].layout, d),
                        100 * t + static_cast<std::uint64_t>(d)));
  return s;
}

// Drops every file under `dir` from the page cache (their pages are clean once synced), so
// reads come from the disk.
void evict(const fs::path& dir) {
  ::sync();
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Runs fn on every device of a 4-device threads launch between two barriers; returns the
// slowest device's seconds.
double timed_launch(const std::function<void(Communicator&)>& fn) {
  std::mutex mu;
  double slowest = 0;
  launch({.devices = first_devices(kDevices)}, [&](Communicator& world) {
    barrier(world);
    const double s = time_once([&] {
      fn(world);
      barrier(world);
    });
    std::lock_guard lock(mu);
    slowest = std::max(slowest, s);
  });
  return slowest;
}

}  // namespace

namespace {

// This process's CPU seconds so far (every thread).
double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// train_ckpt_every_step: the bench GPT on one device with AdamW, a checkpoint after every step,
// against the same run without checkpoints, run after run in turn (checkpoint_bench.h).
BenchResult every_step_case(const CheckpointBenchOptions& o, const fs::path& dir) {
  const GptConfig c;
  const GptFiles files(c, 1);
  const Model m = files.load("one");
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  std::int64_t state_bytes = 0;  // the weights and both AdamW moments: the snapshot's bytes
  for (const Node& n : m.pcg.nodes)
    if (n.kind == NodeKind::kWeight)
      state_bytes += 3 * numel(n.spec.shape) * static_cast<std::int64_t>(size_of(n.spec.dtype));
  BenchResult r{.case_name = "train_ckpt_every_step",
                .backend = "threads",
                .mesh = "1",
                .devices = 1,
                .bytes = state_bytes};
  std::vector<double> pauses, floors, extra_cpu;
  std::vector<std::byte> from(static_cast<std::size_t>(state_bytes)), to(from.size());
  const int steps = o.train_steps;
  for (int round = 0; round < o.reps; ++round) {
    for (const bool checkpoints : {false, true}) {
      TrainOptions t{.steps = steps, .optimizer = adamw};
      const fs::path ck = dir / "every_step";
      fs::remove_all(ck);
      if (checkpoints) t.checkpoint = CheckpointOptions{.dir = ck, .every = 1, .keep_last = 1};
      std::vector<double> times;
      t.progress = [&](const StepReport& s) {
        if (s.step == 1) return;  // the first step warms up
        const double pause = s.checkpoint_pause_s.value_or(0);
        times.push_back(s.seconds + pause);
        if (checkpoints && s.step < steps) pauses.push_back(pause);  // the last waits for its write
      };
      const double cpu = process_cpu_s();
      const double wall = time_once([&] { train_model(m, t); });
      (checkpoints ? r.case_s : r.baseline_s).push_back(median(times));
      if (checkpoints)
        extra_cpu.push_back(process_cpu_s() - cpu);
      else
        extra_cpu.push_back(-(process_cpu_s() - cpu));
      (void)wall;
      floors.push_back(time_once([&] { std::memcpy(to.data(), from.data(), from.size()); }));
      fs::remove_all(ck);
    }
  }
  // The writer's CPU seconds per checkpoint: the runs' CPU time with checkpoints over that
  // without, per step.
  double cpu_diff = 0;
  for (double x : extra_cpu) cpu_diff += x;
  const double writer_cpu = std::max(0.0, cpu_diff / o.reps / steps);
  const double step_s = median(r.baseline_s);
  const int cores = available_cores();
  r.baseline = "no_checkpoints";
  r.extra["steps"] = steps;
  r.extra["writer_cpu_s_per_checkpoint"] = writer_cpu;
  r.extra["target_vs_baseline"] = 1.05 + writer_cpu / (cores * step_s);
  double mean_pause = 0;
  for (double p : pauses) mean_pause += p;
  mean_pause /= std::max<std::size_t>(1, pauses.size());
  r.extra["mean_checkpoint_pause_s"] = mean_pause;
  r.extra["snapshot_memcpy_s"] = median(floors);
  r.extra["pause_vs_memcpy"] = mean_pause / median(floors);
  r.extra["model"] =
      "GPT: 2 blocks, width 512, 8 heads, sequence 256, batch 8, vocabulary 8192, "
      "AdamW, one device";
  return r;
}

}  // namespace

BenchReport run_checkpoint_bench(const CheckpointBenchOptions& o) {
  BenchReport report{.benchmark = "checkpoint", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const fs::path dir = (o.dir.empty() ? fs::temp_directory_path() : o.dir) /
                       fmt::format("meshflow_bench_checkpoint_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const State state = make_state(o.bytes);
  const fs::path script = dir / "baseline.py";
  std::ofstream(script) << kNumpyScript;
  const nlohmann::json optimizer = {{"kind", "adamw"}, {"lr", 0.001}};
  BenchResult save{.case_name = "save",
                   .backend = "threads",
                   .mesh = "2x2",
                   .devices = kDevices,
                   .bytes = state.bytes};
  BenchResult load{.case_name = "load",
                   .backend = "threads",
                   .mesh = "2x2",
                   .devices = kDevices,
                   .bytes = state.bytes};
  std::vector<double> save_io, save_hash, load_io, load_hash;
  std::int64_t save_peak = 0, load_peak = 0;
  bool have_numpy = true;
  const std::int64_t shard_rows = state.tensors[0].layout.shape[0] / 2;
  try {
    for (int rep = 0; rep < o.reps; ++rep) {
      const fs::path ck = dir / "ck";
      fs::remove_all(ck);
      // save
      std::int64_t before = status_bytes("VmRSS:");
      reset_peak_memory();
      save.case_s.push_back(timed_launch([&](Communicator& world) {
        std::vector<SavedTensor> mine = state.tensors;
        for (std::size_t t = 0; t < mine.size(); ++t)
          mine[t].shard = &state.shards[static_cast<std::size_t>(world.device())][t];
        save_checkpoint(world, 0, {.dir = ck}, 1, optimizer, mine);
      }));
      save_peak = std::max(save_peak, status_bytes("VmHWM:") - before);
      // The floor's parts: the same files written plainly with the same fsyncs; sha256 of the
      // same bytes.
      const fs::path plain = dir / "plain";
      fs::remove_all(plain);
      fs::create_directories(plain);
      save_io.push_back(timed_launch([&](Communicator& world) {
        const auto& mine = state.shards[static_cast<std::size_t>(world.device())];
        for (std::size_t t = 0; t < mine.size(); ++t) {
          const File f = File::create(plain / fmt::format("d{}t{}.bin", world.device(), t));
          f.write_at(0, {mine[t].bytes(), mine[t].nbytes()});
          f.sync();
        }
      }));
      save_hash.push_back(timed_launch([&](Communicator& world) {
        for (const Tensor& t : state.shards[static_cast<std::size_t>(world.device())]) {
          Sha256 h;
          h.update({t.bytes(), t.nbytes()});
          h.hex();
        }
      }));
      save.floor_s.push_back(std::max(save_io.back(), save_hash.back()));
      // load: verify once (shared out), then each device's boxes in the other layout.
      const Checkpoint c = read_checkpoint(ck / "step-1");
      evict(ck);  // a resume reads from the disk
      before = status_bytes("VmRSS:");
      reset_peak_memory();
      std::vector<std::vector<Tensor>> loaded(kDevices);
      std::vector<LoadTarget> targets;
      for (std::size_t t = 0; t < state.tensors.size(); ++t)
        targets.push_back({state.tensors[t].name, state.load_layouts[t]});
      CheckpointLoadArea area;
      load.case_s.push_back(timed_launch([&](Communicator& world) {
        loaded[static_cast<std::size_t>(world.device())] =
            load_checkpoint(world, c, targets, &area);
      }));
      // The loaded state itself is what a resume holds; the rest is extra.
      load_peak = std::max(load_peak, status_bytes("VmHWM:") - before - state.bytes);
      loaded.clear();
      // The same files read plainly, each whole by one device, from the disk as the load read
      // them.
      evict(ck);
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(ck / "step-1"))
        if (e.path().extension() == ".npy") files.push_back(e.path());
      std::sort(files.begin(), files.end());
      load_io.push_back(timed_launch([&](Communicator& world) {
        for (std::size_t j = 0; j < files.size(); ++j) {
          if (static_cast<int>(j % kDevices) != world.rank()) continue;
          const File f = File::open_read(files[j]);
          Tensor into = Tensor::uninitialized(DType::kInt64, {(f.size() + 7) / 8});
          f.read_at(0, {into.bytes(), static_cast<std::size_t>(f.size())});
        }
      }));
      load_hash.push_back(save_hash.back());
      load.floor_s.push_back(std::max(load_io.back(), load_hash.back()));
      fs::remove_all(plain);
      if (have_numpy) {
        const fs::path np_dir = dir / "numpy";
        fs::remove_all(np_dir);
        fs::create_directories(np_dir);
        const int count = static_cast<int>(state.tensors.size()) * kDevices;
        const auto s = numpy_seconds(o, script, "save", np_dir, shard_rows, count);
        evict(np_dir);
        const auto l = numpy_seconds(o, script, "load", np_dir, shard_rows, count);
        if (s && l) {
          save.baseline_s.push_back(*s);
          load.baseline_s.push_back(*l);
        } else {
          have_numpy = false;
        }
        fs::remove_all(np_dir);
      }
    }
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  fs::remove_all(dir);
  for (auto* r : {&save, &load}) {
    if (!r->baseline_s.empty()) r->baseline = "numpy";
  }
  save.extra = {{"io_s", median(save_io)},
                {"hash_s", median(save_hash)},
                {"peak_extra_bytes", save_peak},
                {"gbps", state.bytes / median(save.case_s) / 1e9}};
  load.extra = {{"io_s", median(load_io)},
                {"hash_s", median(load_hash)},
                {"peak_extra_bytes", load_peak},
                {"gbps", state.bytes / median(load.case_s) / 1e9}};
  add_result(report, std::move(save));
  add_result(report, std::move(load));
  if (o.train_steps > 1) {
    fs::create_directories(dir);
    try {
      add_result(report, every_step_case(o, dir));
    } catch (...) {
      fs::remove_all(dir);
      throw;
    }
    fs::remove_all(dir);
  }
  return report;
}

}  // namespace meshflow::bench
