// The train benchmark: the MLP on each mesh, the PyTorch baseline, the deep MLP's compile.
#include "bench/train_bench.h"

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "bench/collectives_bench.h"
#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/runtime/model_runner.h"

namespace meshflow::bench {

namespace {

namespace fs = std::filesystem;

// The MLP on `mesh_text`: one device or data parallel (x S(0), weights R) on a 1-d mesh, DP×TP
// on a 2-d one (w1 column-, w2 row-parallel, then a reduction over tp).
Model mlp(const TrainBenchOptions& o, const std::string& mesh_text, const fs::path& labels) {
  Model m;
  Pcg& g = m.pcg;
  const DeviceMesh mesh = parse_mesh(mesh_text);
  const bool tp = ndim(mesh) == 2;
  auto P = [&](const char* one_d, const char* two_d) {
    return parse_placements(tp ? two_d : one_d);
  };
  const ValueId x =
      add_input(g, "x", {{o.batch, o.in}}, mesh, P("S(0)", "S(0),R"), Source::normal(1, 1));
  const ValueId y = add_input(g, "y", {{o.batch}, DType::kInt64}, mesh, P("S(0)", "S(0),R"),
                              Source{.kind = Source::Kind::kNpy, .path = labels});
  const ValueId w1 =
      add_weight(g, "w1", {{o.in, o.hidden}}, mesh, P("R", "R,S(1)"), Source::normal(0.02, 2));
  const ValueId b1 =
      add_weight(g, "b1", {{o.hidden}}, mesh, P("R", "R,S(0)"), Source::normal(0.02, 3));
  const ValueId w2 =
      add_weight(g, "w2", {{o.hidden, o.in}}, mesh, P("R", "R,S(0)"), Source::normal(0.02, 4));
  const ValueId b2 = add_weight(g, "b2", {{o.in}}, mesh, P("R", "R,R"), Source::normal(0.02, 5));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kLinear}, {x, w1, b1});
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kRelu}, {h});
  ValueId out = add_compute(g, "o", Op{.type = OpType::kLinear}, {a, w2, b2});
  if (tp) {
    out = add_parallel(
        g, "r",
        ParallelOp{.type = ParallelType::kReduction, .degree = static_cast<int>(mesh.shape[1])},
        out, std::nullopt, parse_placements("S(0),R"));
  }
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kSoftmaxCrossEntropy}, {out, y}));
  return m;
}

// Returns PyTorch's step times for the same MLP on `threads` threads, or nothing when torch
// does not import (Debian's python3-torch is optional).
std::vector<double> pytorch_steps(const TrainBenchOptions& o, int threads, int steps) {
  const std::string script = fmt::format(
      "import json, time, torch\n"
      "torch.set_num_threads({threads}); torch.manual_seed(0)\n"
      "x = torch.randn({b}, {i}); y = torch.randint(0, {i}, ({b},))\n"
      "m = torch.nn.Sequential(torch.nn.Linear({i}, {h}), torch.nn.ReLU(), torch.nn.Linear({h}, "
      "{i}))\n"
      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
      "times = []\n"
      "for s in range({steps}):\n"
      "    t = time.perf_counter(); opt.zero_grad()\n"
      "    loss = torch.nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step()\n"
      "    times.append(time.perf_counter() - t)\n"
      "print(json.dumps(times[{warmup}:]))\n",
      fmt::arg("threads", threads), fmt::arg("b", o.batch), fmt::arg("i", o.in),
      fmt::arg("h", o.hidden), fmt::arg("steps", steps + o.warmup), fmt::arg("warmup", o.warmup));
  const fs::path file = fs::temp_directory_path() / fmt::format("meshflow_torch_{}.py", ::getpid());
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    if (!f) return {};
    std::fputs(script.c_str(), f);
    std::fclose(f);
  }
  const std::string cmd =
      fmt::format("OMP_NUM_THREADS={} /usr/bin/python3 {} 2>/dev/null", threads, file.string());
  std::string out;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf{};
    while (std::fgets(buf.data(), buf.size(), p)) out += buf.data();
    ::pclose(p);
  }
  fs::remove(file);
  try {
    return nlohmann::json::parse(out).get<std::vector<double>>();
  } catch (const std::exception&) {
    return {};
  }
}

BenchResult train_step_case(const TrainBenchOptions& o, const std::string& mesh_text,
                            const fs::path& labels) {
  const Model m = mlp(o, mesh_text, labels);
  const DeviceMesh mesh = parse_mesh(mesh_text);
  BenchResult r{.case_name = "train_step",
                .backend = "threads",
                .mesh = mesh_text,
                .devices = size(mesh),
                .bytes = (o.batch * o.in + 2 * o.in * o.hidden) * 4};
  const TrainReport t = train_model(m, TrainOptions{.steps = o.warmup + o.reps, .lr = 0.01});
  std::vector<double> kernel, movement, overhead;
  for (std::size_t i = static_cast<std::size_t>(o.warmup); i < t.steps.size(); ++i) {
    const StepReport& s = t.steps[i];
    r.case_s.push_back(s.seconds);
    kernel.push_back(s.times.compute_s);
    movement.push_back(s.times.move_s);
    overhead.push_back(s.seconds - s.times.compute_s - s.times.move_s);
  }
  const double step_s = median(r.case_s);
  r.extra["kernel_s"] = median(kernel);
  r.extra["movement_s"] = median(movement);
  r.extra["overhead_s"] = median(overhead);
  r.extra["overhead_fraction"] = step_s > 0 ? median(overhead) / step_s : 0.0;
  r.extra["model"] = fmt::format("batch {}, {} -> {} -> {}, softmax cross-entropy, SGD", o.batch,
                                 o.in, o.hidden, o.in);
  if (o.pytorch) {
    const int threads = size(mesh) == 1 ? 1 : 2;
    std::vector<double> torch = pytorch_steps(o, threads, o.reps);
    if (!torch.empty()) {
      r.baseline = "pytorch";
      r.baseline_s = std::move(torch);
      r.extra["pytorch_threads"] = threads;
    }
  }
  return r;
}

// A 1,000-layer MLP on an 8x8 mesh: column- then row-parallel linear layers with tanh between.
Pcg deep_mlp(int layers) {
  Pcg g;
  const DeviceMesh mesh = parse_mesh("8x8");
  constexpr std::int64_t kWidth = 64, kBatch = 256;
  ValueId v =
      add_input(g, "x", {{kBatch, kWidth}}, mesh, parse_placements("S(0),R"), Source::normal(1, 1));
  for (int i = 0; i < layers; ++i) {
    const char* placements = i % 2 == 0 ? "R,S(1)" : "R,S(0)";
    const ValueId w = add_weight(g, fmt::format("w{}", i), {{kWidth, kWidth}}, mesh,
                                 parse_placements(placements), Source::normal(0.1, 10 + i));
    v = add_compute(g, fmt::format("h{}", i), Op{.type = OpType::kMatmul}, {v, w});
    v = add_compute(g, fmt::format("a{}", i), Op{.type = OpType::kTanh}, {v});
  }
  const ValueId t =
      add_input(g, "t", {{kBatch, kWidth}}, mesh, parse_placements("S(0),R"), Source::normal(1, 2));
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {v, t}));
  return g;
}

BenchResult compile_case(const TrainBenchOptions& o) {
  const Pcg g = deep_mlp(o.layers);
  BenchResult r{
      .case_name = "compile", .backend = "host", .mesh = "8x8", .devices = 64, .bytes = 0};
  std::size_t tasks = 0, nodes = 0;
  for (int rep = -o.warmup; rep < o.reps; ++rep) {
    const double s = time_once([&] {
      const Pcg c = compile(g, Mode::kTrain);
      const TaskGraph t = expand_shards(c, {});
      nodes = c.nodes.size();
      tasks = 0;
      for (const DeviceTasks& dt : t.devices) tasks += dt.tasks.size();
    });
    if (rep >= 0) r.case_s.push_back(s);
  }
  r.extra["layers"] = o.layers;
  r.extra["nodes"] = nodes;
  r.extra["tasks"] = tasks;
  r.extra["target_s"] = 1.0;
  return r;
}

}  // namespace

BenchReport run_train_bench(const TrainBenchOptions& o) {
  BenchReport report{.benchmark = "train", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const fs::path labels =
      fs::temp_directory_path() / fmt::format("meshflow_labels_{}.npy", ::getpid());
  Tensor y(DType::kInt64, {o.batch});
  for (std::int64_t i = 0; i < o.batch; ++i) y.data<std::int64_t>()[i] = (i * 7919) % o.in;
  write_npy(labels, y);
  try {
    for (const std::string& mesh : o.meshes) add_result(report, train_step_case(o, mesh, labels));
  } catch (...) {
    fs::remove(labels);
    throw;
  }
  fs::remove(labels);
  add_result(report, compile_case(o));
  return report;
}

}  // namespace meshflow::bench
