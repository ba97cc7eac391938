// The train benchmark: the MLP on each mesh, the PyTorch baseline, the deep MLP's compile.
#include "bench/train_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "bench/collectives_bench.h"
#include "bench/floor.h"
#include "bench/gpt_model.h"
#include "bench/torch_gpt.h"
#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"
#include "meshflow/data/prepare.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/passes.h"
#include "meshflow/graph/source.h"
#include "meshflow/graph/task_graph.h"
#include "meshflow/kernels/optimizer.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/attention.h"
#include "meshflow/ops/matmul.h"
#include "meshflow/train/data_feed.h"
#include "meshflow/train/trainer.h"

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

// Returns the step times of PyTorch running `model` (Python that defines `step()`, one SGD step)
// on `threads` threads, or nothing when torch does not import (Debian's python3-torch is
// optional).
std::vector<double> pytorch_steps(const TrainBenchOptions& o, const std::string& model, int threads,
                                  int steps) {
  const std::string script = fmt::format(
      "import json, math, time, torch\n"
      "torch.set_num_threads({threads}); torch.manual_seed(0)\n"
      "F = torch.nn.functional\n"
      "{model}"
      "times = []\n"
      "for s in range({steps}):\n"
      "    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)\n"
      "print(json.dumps(times[{warmup}:]))\n",
      fmt::arg("threads", threads), fmt::arg("model", model), fmt::arg("steps", steps + o.warmup),
      fmt::arg("warmup", o.warmup));
  const std::optional<nlohmann::json> j =
      run_command({"/usr/bin/python3", "-c", script}, {fmt::format("OMP_NUM_THREADS={}", threads)})
          .json();
  if (!j || !j->is_array()) return {};
  return j->get<std::vector<double>>();
}

// Returns the seconds of DESIGN's floor for an optimizer step over `bytes` of weights: memcpy
// of the weight and each of its `states` state tensors plus one read of the gradient, on the
// calling thread, between buffers allocated once.
struct OptimizerFloor {
  std::int64_t bytes = 0;
  int states = 0;
  std::vector<Tensor> src, dst;
  Tensor grad;
  OptimizerFloor(std::int64_t b, int s) : bytes(b), states(s), grad(DType::kFloat32, {b / 4}) {
    for (int i = 0; i <= s; ++i) {
      src.emplace_back(DType::kFloat32, Shape{b / 4});
      dst.emplace_back(DType::kFloat32, Shape{b / 4});
    }
  }
  double time() {
    double sink = 0;
    const double s = time_once([&] {
      for (std::size_t i = 0; i < src.size(); ++i)
        std::memcpy(dst[i].bytes(), src[i].bytes(), src[i].nbytes());
      sink = sum_of_squares(grad);
    });
    if (sink != 0) std::abort();  // zeros: the read cannot be optimised away
    return s;
  }
};

// Returns the threads each of `devices` devices computes with in this bench.
int device_threads(const TrainBenchOptions& o, int devices) {
  return o.threads_per_device > 0 ? o.threads_per_device : default_threads_per_device(devices);
}

// Returns explain's estimate of the step train_model runs for `m` (threads, no overlap), priced
// with o.machine's description for its devices, which r's "machine" names.
Explanation estimated_step(const Model& m, const TrainBenchOptions& o, const Optimizer& optimizer,
                           int micro_batches, int zero, int threads_per_device, Recompute recompute,
                           BenchResult& r) {
  const ChosenMachine machine =
      o.machine ? o.machine(model_device_count(m), threads_per_device)
                : ChosenMachine{.machine = default_machine(), .source = "built-in"};
  r.extra["machine"] = machine.source;
  Explanation e = explain_compiled(m.pcg, {.plan = {.machine = &machine.machine},
                                           .decompose = {.shared_memory = true},
                                           .update = optimizer.rule,
                                           .micro_batches = micro_batches,
                                           .zero = zero,
                                           .recompute = recompute,
                                           .threads_per_device = threads_per_device});
  MESHFLOW_CHECK(e.step_time.has_value(), "a training model without a step estimate");
  return e;
}

// Returns the task graph of a training step of `m` (what its products' floor reads).
TaskGraph training_tasks(const Model& m, const Optimizer& optimizer, int micro_batches) {
  const Pcg g =
      compile(m.pcg, Mode::kTrain, {.update = optimizer.rule, .micro_batches = micro_batches});
  return expand_shards(g, {*g.loss});
}

// Trains `m` with `optimizer` for warmup + reps steps on threads and fills r's times with the
// timed steps, and its extras with the medians of the reporting device's kernel, movement and
// other time, and of its optimizer's time against the optimizer's floor (measured between the
// steps on the reporting device's thread, for `weight_bytes` per device), and explain's
// estimate of the step against the measured median; with `products`, r's floor too.
void time_training(const Model& m, const TrainBenchOptions& o, const Optimizer& optimizer,
                   std::int64_t weight_bytes, BenchResult& r, int micro_batches = 1,
                   ProductFloor* products = nullptr, int zero = 0,
                   Recompute recompute = Recompute::kNone) {
  OptimizerFloor floor(weight_bytes, static_cast<int>(state_names(optimizer.rule).size()));
  std::vector<double> floors;
  TrainOptions options{.steps = o.warmup + o.reps,
                       .optimizer = optimizer,
                       .micro_batches = micro_batches,
                       .zero = zero,
                       .recompute = recompute};
  options.run.threads_per_device = device_threads(o, static_cast<int>(r.devices));
  r.extra["threads_per_device"] = options.run.threads_per_device;
  options.progress = [&](const StepReport& s) {
    if (s.step <= o.warmup) return;
    floors.push_back(floor.time());
  };
  // The products' floor runs every device at once, so not between the steps: the devices other
  // than the reporting one are computing the next step there. Half before the run, half after.
  if (products) {
    for (int i = 0; i < (o.reps + 1) / 2; ++i) r.floor_s.push_back(products->time());
  }
  const TrainReport t = train_model(m, options);
  if (products) {
    for (int i = (o.reps + 1) / 2; i < o.reps; ++i) r.floor_s.push_back(products->time());
  }
  std::vector<double> kernel, movement, overhead, update, wait;
  for (std::size_t i = static_cast<std::size_t>(o.warmup); i < t.steps.size(); ++i) {
    const StepReport& s = t.steps[i];
    if (s.times.data_wait_s) wait.push_back(*s.times.data_wait_s);
    r.case_s.push_back(s.seconds);
    kernel.push_back(s.times.compute_s);
    movement.push_back(s.times.move_s);
    overhead.push_back(s.seconds - s.times.compute_s - s.times.move_s);
    update.push_back(s.times.update_s);
  }
  const double step_s = median(r.case_s);
  r.extra["kernel_s"] = median(kernel);
  r.extra["movement_s"] = median(movement);
  r.extra["overhead_s"] = median(overhead);
  r.extra["overhead_fraction"] = step_s > 0 ? median(overhead) / step_s : 0.0;
  r.extra["optimizer"] = std::string(to_string(optimizer.rule.kind));
  r.extra["optimizer_s"] = median(update);
  r.extra["optimizer_floor_s"] = median(floors);
  r.extra["optimizer_vs_floor"] = median(floors) > 0 ? median(update) / median(floors) : 0.0;
  if (!wait.empty()) {
    r.extra["data_wait_s"] = median(wait);
    r.extra["data_wait_fraction"] = step_s > 0 ? median(wait) / step_s : 0.0;
  }
  r.extra["measured_peak_bytes"] = t.measured.peak;
  r.extra["measured_memory"] = to_json(t.measured.at_peak);
  const Explanation e = estimated_step(m, o, optimizer, micro_batches, zero,
                                       options.run.threads_per_device, recompute, r);
  const StepTime& est = *e.step_time;
  r.extra["est_peak_bytes"] = e.memory->peak;
  r.extra["est_memory"] = to_json(e.memory->at_peak);
  r.extra["est_step_s"] = est.total();
  r.extra["est_vs_measured"] = step_s > 0 ? est.total() / step_s : 0.0;
  r.extra["est_kernel_s"] = est.compute_s + est.update_s;  // as kernel_s counts them
  r.extra["est_movement_s"] = est.move_s;
}

// Returns the bytes of the weight shards the reporting device (the lowest of the meshes)
// holds: what its optimizer step reads and writes per state.
std::int64_t weight_bytes(const Model& m) {
  const Pcg laid_out = infer_layouts(m.pcg);
  const DeviceId reporter = pcg_devices(laid_out).front();
  std::int64_t bytes = 0;
  for (const Node& n : laid_out.nodes) {
    if (n.kind != NodeKind::kWeight || !find_device(n.layout->mesh, reporter)) continue;
    bytes += numel(shard_box(*n.layout, reporter).extent) * size_of(n.spec.dtype);
  }
  return bytes;
}

// Returns the MLP of `mesh_text` reading its x and y from sample arrays of 8 batches written into
// `dir` (shuffled order): mlp_step_data's model.
Model mlp_on_data(const TrainBenchOptions& o, const std::string& mesh_text, const fs::path& labels,
                  const fs::path& dir) {
  Model m = mlp(o, mesh_text, labels);
  const std::int64_t n = 8 * o.batch;
  Tensor x = random_tensor(DType::kFloat32, {n, o.in}, 7);
  Tensor y(DType::kInt64, {n});
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int64_t>()[i] = (i * 7919) % o.in;
  write_npy(dir / "x.npy", x);
  write_npy(dir / "y.npy", y);
  m.data = {{"train", {{"x", "x.npy"}, {"y", "y.npy"}}}, {"order", "shuffled"}};
  m.base = dir;
  for (Node& node : m.pcg.nodes) {
    if (node.kind == NodeKind::kInput)
      node.source = Source{.kind = Source::Kind::kData, .data = node.name};
  }
  return m;
}

// `name` (gpt_step_data, mlp_step_data): `with_data` (reading a dataset each step) against
// `fixed` (the same model on one fixed batch), timed alternately in two rounds of the same run
// (baseline "fixed_batch"), with the data wait.
BenchResult data_case(const TrainBenchOptions& o, const std::string& name, const Model& fixed,
                      const Model& with_data, const std::string& mesh_text, std::int64_t bytes,
                      const Optimizer& optimizer) {
  BenchResult base{.case_name = name, .mesh = mesh_text, .devices = size(parse_mesh(mesh_text))};
  BenchResult r{.case_name = name,
                .backend = "threads",
                .mesh = mesh_text,
                .devices = size(parse_mesh(mesh_text)),
                .bytes = bytes};
  for (int round = 0; round < 2; ++round) {
    time_training(fixed, o, optimizer, weight_bytes(fixed), base);
    time_training(with_data, o, optimizer, weight_bytes(with_data), r);
  }
  r.baseline = "fixed_batch";
  r.baseline_s = base.case_s;
  return r;
}

// `name` (mlp_step_micro4, gpt_step_micro4): model `m` trained in 4 micro-batches against the
// same step in one, in the same run (baseline "micro_batches_1"); also each one's peak bytes.
BenchResult micro_case(const TrainBenchOptions& o, const std::string& name, const Model& m,
                       const std::string& mesh_text, std::int64_t bytes) {
  constexpr int kMicro = 4;
  BenchResult whole{.case_name = name, .mesh = mesh_text, .devices = size(parse_mesh(mesh_text))};
  BenchResult r{.case_name = name,
                .backend = "threads",
                .mesh = mesh_text,
                .devices = size(parse_mesh(mesh_text)),
                .bytes = bytes};
  const Optimizer sgd = resolve_optimizer({.lr = 0.01});
  time_training(m, o, sgd, weight_bytes(m), whole, 1);
  time_training(m, o, sgd, weight_bytes(m), r, kMicro);
  r.baseline = "micro_batches_1";
  r.baseline_s = whole.case_s;
  r.extra["micro_batches"] = kMicro;
  r.extra["micro_batches_1_peak_bytes"] = whole.extra["measured_peak_bytes"];
  return r;
}

// `name` (mlp_step_adamw_zero1, mlp_step_adamw_zero3): the MLP on 4-way data parallelism
// trained with AdamW at ZeRO level `zero` against the same step at --zero 0, in the same run
// (baseline "zero_0"); also each one's peak bytes, measured and estimated. The optimizer's
// floor is that of the weight bytes each device updates (a quarter under ZeRO).
BenchResult zero_case(const TrainBenchOptions& o, const std::string& name, const Model& m,
                      int zero) {
  const std::string mesh_text = "4";
  BenchResult whole{.case_name = name, .mesh = mesh_text, .devices = size(parse_mesh(mesh_text))};
  BenchResult r{.case_name = name,
                .backend = "threads",
                .mesh = mesh_text,
                .devices = 4,
                .bytes = weight_bytes(m)};
  const Optimizer adamw = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  time_training(m, o, adamw, weight_bytes(m), whole);
  time_training(m, o, adamw, weight_bytes(m) / 4, r, 1, nullptr, zero);
  r.baseline = "zero_0";
  r.baseline_s = whole.case_s;
  r.extra["zero"] = zero;
  r.extra["zero_0_peak_bytes"] = whole.extra["measured_peak_bytes"];
  r.extra["zero_0_measured_memory"] = whole.extra["measured_memory"];
  // time_training estimated each level's peak (r's "est_peak_bytes").
  r.extra["zero_0_est_peak_bytes"] = whole.extra["est_peak_bytes"];
  return r;
}

// Sets r's baseline to PyTorch's step times for `model`, on as many threads as r's devices
// compute with together (pytorch_threads).
void add_pytorch_baseline(const TrainBenchOptions& o, const std::string& model, BenchResult& r) {
  if (!o.pytorch) return;
  const int devices = static_cast<int>(r.devices);
  const int threads = devices * device_threads(o, devices);
  std::vector<double> torch = pytorch_steps(o, model, threads, o.reps);
  if (torch.empty()) return;
  r.baseline = "pytorch";
  r.baseline_s = std::move(torch);
  r.extra["pytorch_threads"] = threads;
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
  time_training(m, o, resolve_optimizer({.lr = 0.01}), weight_bytes(m), r);
  r.extra["model"] = fmt::format("batch {}, {} -> {} -> {}, softmax cross-entropy, SGD", o.batch,
                                 o.in, o.hidden, o.in);
  add_pytorch_baseline(
      o,
      fmt::format("x = torch.randn({b}, {i}); y = torch.randint(0, {i}, ({b},))\n"
                  "m = torch.nn.Sequential(torch.nn.Linear({i}, {h}), torch.nn.ReLU(), "
                  "torch.nn.Linear({h}, {i}))\n"
                  "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                  "def step():\n"
                  "    opt.zero_grad(); F.cross_entropy(m(x), y).backward(); opt.step()\n",
                  fmt::arg("b", o.batch), fmt::arg("i", o.in), fmt::arg("h", o.hidden)),
      r);
  return r;
}

// gpt_step (SGD at lr 0.01) or gpt_step_adamw (AdamW with torch's defaults), each against
// PyTorch eager's same model with the same optimizer.
BenchResult gpt_step_case(const TrainBenchOptions& o, const std::string& mesh_text,
                          OptimizerKind kind) {
  const GptConfig& c = o.gpt;
  const int devices = static_cast<int>(size(parse_mesh(mesh_text)));
  const GptFiles files(c, devices);
  const Model m = files.load(devices == 1 ? "one" : "dp");
  const bool adamw = kind == OptimizerKind::kAdamW;
  BenchResult r{.case_name = adamw ? "gpt_step_adamw" : "gpt_step",
                .backend = "threads",
                .mesh = mesh_text,
                .devices = size(parse_mesh(mesh_text)),
                .bytes = c.batch * c.seq * c.width * 4};
  const Optimizer optimizer =
      adamw ? resolve_optimizer({.kind = kind}) : resolve_optimizer({.lr = 0.01});
  ProductFloor products(training_tasks(m, optimizer, 1), 1,
                        device_threads(o, static_cast<int>(r.devices)));
  time_training(m, o, optimizer, weight_bytes(m), r, 1, &products);
  r.extra["floor_products"] = products.products();
  r.extra["model"] = fmt::format(
      "GPT: {} pre-norm blocks, width {}, {} heads, sequence {}, batch {}, vocabulary {}, "
      "float32, data parallel, {}",
      c.blocks, c.width, c.heads, c.seq, c.batch, c.vocab, adamw ? "AdamW" : "SGD");
  add_pytorch_baseline(
      o, pytorch_gpt(c, adamw ? "torch.optim.AdamW(params)" : "torch.optim.SGD(params, lr=0.01)"),
      r);
  return r;
}

// `gpt_step_selective` or `gpt_step_full`: the gpt_step model (SGD) with activation
// recomputation against the same step without it, in the same run (baseline
// "recompute_none"), each with its measured memory; the activations' ratio is the issue's
// target (selective at most 0.85, full at most 0.5, at a step at most 1.10x and 1.40x).
BenchResult recompute_case(const TrainBenchOptions& o, const std::string& mesh_text,
                           Recompute policy) {
  const GptConfig& c = o.gpt;
  const int devices = static_cast<int>(size(parse_mesh(mesh_text)));
  const GptFiles files(c, devices);
  const Model m = files.load(devices == 1 ? "one" : "dp");
  const Optimizer sgd = resolve_optimizer({.lr = 0.01});
  BenchResult none{.case_name = "gpt_step", .mesh = mesh_text, .devices = devices};
  BenchResult r{.case_name = fmt::format("gpt_step_{}", to_string(policy)),
                .backend = "threads",
                .mesh = mesh_text,
                .devices = devices,
                .bytes = c.batch * c.seq * c.width * 4};
  // Alternated in two rounds, so that drift falls on both alike.
  for (int round = 0; round < 2; ++round) {
    time_training(m, o, sgd, weight_bytes(m), none);
    time_training(m, o, sgd, weight_bytes(m), r, 1, nullptr, 0, policy);
  }
  r.baseline = "recompute_none";
  r.baseline_s = none.case_s;
  r.extra["recompute"] = std::string(to_string(policy));
  r.extra["none_measured_peak_bytes"] = none.extra["measured_peak_bytes"];
  r.extra["none_measured_memory"] = none.extra["measured_memory"];
  r.extra["none_est_peak_bytes"] = none.extra["est_peak_bytes"];
  const double act = r.extra["measured_memory"]["activations"].get<double>();
  const double none_act = none.extra["measured_memory"]["activations"].get<double>();
  r.extra["activations_vs_none"] = none_act > 0 ? act / none_act : 0.0;
  r.extra["step_vs_none"] = median(r.case_s) / median(none.case_s);
  r.extra["est_vs_measured_peak"] =
      r.extra["est_peak_bytes"].get<double>() / r.extra["measured_peak_bytes"].get<double>();
  r.extra["model"] = fmt::format(
      "the gpt_step model (SGD) with --recompute {}, against --recompute none in the same run",
      to_string(policy));
  return r;
}

// Returns the bytes device 0 sends to other devices in one forward pass (Mode::kRun) or one
// training step (Mode::kTrain) of `m` on threads, as a RecordingCommunicator counts them.
std::int64_t bytes_sent(const Model& m, Mode mode) {
  std::int64_t bytes = 0;
  for (const RecordedCall& call : record_calls(compile(m.pcg, mode)).at(0))
    bytes += call.bytes_sent;
  return bytes;
}

// Megatron TP + SP on 4 devices: the bytes one block adds to a forward pass and to a training
// step (the model with `blocks` blocks minus the one with blocks - 1), against the analytic
// count: per block and pass two all-gathers and two reduce-scatters of the [batch, seq, width]
// activations, and in a step the reduction of the layer norms' gradients.
BenchResult gpt_sp_bytes_case(const TrainBenchOptions& o) {
  const GptConfig& c = o.gpt;
  constexpr const char* kMesh = "4";
  constexpr std::int64_t kDevices = 4;
  GptConfig fewer = c;
  fewer.blocks = c.blocks - 1;
  BenchResult r{.case_name = "gpt_sp_bytes",
                .backend = "threads",
                .mesh = kMesh,
                .devices = kDevices,
                .bytes = c.batch * c.seq * c.width * 4};
  std::int64_t forward = 0, step = 0;
  const GptFiles more_files(c, kDevices), less_files(fewer, kDevices);
  r.case_s.push_back(time_once([&] {
    const Model more = more_files.load("sp");
    const Model less = less_files.load("sp");
    forward = bytes_sent(more, Mode::kRun) - bytes_sent(less, Mode::kRun);
    step = bytes_sent(more, Mode::kTrain) - bytes_sent(less, Mode::kTrain);
  }));
  // An all-gather or reduce-scatter of the activations: each device sends (n - 1) / n of them.
  // A step also reduces the block's four layer-norm parameter gradients (partial sums over the
  // sequence shards, as in Megatron): vectors this small go by the planner's flat all-reduce,
  // each device sending its whole partial sum to the n - 1 others.
  const std::int64_t collective = r.bytes / kDevices * (kDevices - 1);
  const std::int64_t norm_grads = 4 * (kDevices - 1) * c.width * 4;
  r.extra["block_forward_bytes"] = forward;
  r.extra["block_forward_analytic"] = 4 * collective;
  r.extra["block_step_bytes"] = step;
  r.extra["block_step_analytic"] = 8 * collective + norm_grads;
  r.extra["block_matches_analytic"] =
      forward == 4 * collective && step == 8 * collective + norm_grads;
  r.extra["model"] = fmt::format(
      "the gpt_step model, Megatron TP + SP on 4 devices (make_gpt.py's sp layout); bytes device "
      "0 sends per block, counted by the recording communicator");
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

// PyTorch's GPT in nanoGPT's form (model.py's Block, CausalSelfAttention and MLP without biases
// in the products), its weights loaded from make_gpt.py's initial values in `dir`, trained with
// AdamW at `lr` (torch's other defaults) and clipping at 1 on the batches `dir`/batches.npy holds
// (step t's tokens and next tokens at [t, 0] and [t, 1]); prints each step's seconds and loss.
std::string nanogpt_loop(const GptConfig& c, const fs::path& dir, int steps, double lr) {
  return fmt::format(
      "import json, math, time, numpy as np, torch\n"
      "import torch.nn as nn\n"
      "F = nn.functional\n"
      "B, T, D, H, V, L = {b}, {s}, {d}, {h}, {v}, {l}\n"
      "W = lambda n: torch.from_numpy(np.load('{dir}/' + n + '.npy'))\n"
      "def linear(name):\n"
      "    m = nn.Linear(*W(name).shape, bias=False); m.weight.data = W(name).t().contiguous(); "
      "return m\n"
      "def norm(name):\n"
      "    m = nn.LayerNorm(D); m.weight.data, m.bias.data = W(name + '_w'), W(name + '_b'); "
      "return m\n"
      "class CausalSelfAttention(nn.Module):\n"
      "    def __init__(self, i):\n"
      "        super().__init__()\n"
      "        self.q, self.k, self.v, self.c_proj = [linear(f'b{{i}}_w' + x) for x in 'qkvo']\n"
      "        self.register_buffer('bias', torch.tril(torch.ones(T, T)).view(1, 1, T, T))\n"
      "    def forward(self, x):\n"
      "        b, t, d = x.size()\n"
      "        q, k, v = [f(x).view(b, t, H, d // H).transpose(1, 2) for f in (self.q, self.k, "
      "self.v)]\n"
      "        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
      "        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float('-inf')), "
      "dim=-1)\n"
      "        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))\n"
      "class MLP(nn.Module):\n"
      "    def __init__(self, i):\n"
      "        super().__init__(); self.c_fc, self.c_proj = linear(f'b{{i}}_w1'), "
      "linear(f'b{{i}}_w2')\n"
      "    def forward(self, x): return self.c_proj(F.gelu(self.c_fc(x)))\n"
      "class Block(nn.Module):\n"
      "    def __init__(self, i):\n"
      "        super().__init__()\n"
      "        self.ln_1, self.attn = norm(f'b{{i}}_ln1'), CausalSelfAttention(i)\n"
      "        self.ln_2, self.mlp = norm(f'b{{i}}_ln2'), MLP(i)\n"
      "    def forward(self, x):\n"
      "        x = x + self.attn(self.ln_1(x))\n"
      "        return x + self.mlp(self.ln_2(x))\n"
      "class GPT(nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.wte = nn.Embedding(V, D); self.wte.weight.data = W('tok')\n"
      "        self.wpe = nn.Parameter(W('pos'))\n"
      "        self.h = nn.ModuleList([Block(i) for i in range(L)])\n"
      "        self.ln_f, self.lm_head = norm('lnf'), linear('head')\n"
      "    def forward(self, idx, targets):\n"
      "        x = self.wte(idx) + self.wpe\n"
      "        for block in self.h: x = block(x)\n"
      "        logits = self.lm_head(self.ln_f(x))\n"
      "        return F.cross_entropy(logits.view(-1, V), targets.view(-1))\n"
      "torch.set_num_threads({threads})\n"
      "model = GPT()\n"
      "opt = torch.optim.AdamW(model.parameters(), lr={lr})\n"
      "batches = torch.from_numpy(np.load('{dir}/batches.npy'))\n"
      "out = []\n"
      "for t in range({steps}):\n"
      "    start = time.perf_counter()\n"
      "    loss = model(batches[t, 0], batches[t, 1])\n"
      "    opt.zero_grad(set_to_none=True); loss.backward()\n"
      "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()\n"
      "    out.append([time.perf_counter() - start, loss.item()])\n"
      "print(json.dumps(out))\n",
      fmt::arg("b", c.batch), fmt::arg("s", c.seq), fmt::arg("d", c.width), fmt::arg("h", c.heads),
      fmt::arg("v", c.vocab), fmt::arg("l", c.blocks), fmt::arg("dir", dir.string()),
      fmt::arg("threads", 2), fmt::arg("lr", lr), fmt::arg("steps", steps));
}

// gpt_text: the demo's model over the demo's text against nanoGPT's loop (train_bench.h); null
// where the fortunes are not installed.
std::optional<BenchResult> gpt_text_case(const TrainBenchOptions& o) {
  const fs::path fortunes = "/usr/share/games/fortunes";
  if (!fs::is_directory(fortunes)) return std::nullopt;
  std::vector<fs::path> texts;
  for (const auto& e : fs::directory_iterator(fortunes))
    if (e.is_regular_file() && e.path().filename().string().find('.') == std::string::npos)
      texts.push_back(e.path());
  std::sort(texts.begin(), texts.end());
  const TempFolder dir("meshflow_gpt_text");
  prepare_data({.text = texts, .out = dir.path() / "data", .separator = "%"});
  const GptConfig c{.batch = 16, .seq = 128, .width = 128, .heads = 4, .vocab = 256, .blocks = 2};
  const GptFiles files(c, 2, dir.path() / "data", "gpt2");
  const Model m = files.load("dp");
  const int steps = std::max(o.text_steps, o.warmup + 1);
  const double lr = 3e-3;
  // The initial weights and the batches meshflow feeds, for PyTorch.
  for (const Node& n : m.pcg.nodes)
    if (n.kind == NodeKind::kWeight) write_npy(dir.path() / (n.name + ".npy"), load_global(n));
  {
    const std::optional<ModelData> data = read_model_data(m);
    GlobalBatches batches(*data, {});
    Tensor all(DType::kInt64, {steps, 2, c.batch, c.seq});
    const std::int64_t each = c.batch * c.seq;
    for (int t = 1; t <= steps; ++t) {
      std::map<std::string, Tensor> b = batches.at(t, false);
      std::copy_n(b.at("tokens").data<std::int64_t>().data(), each,
                  all.data<std::int64_t>().data() + (t - 1) * 2 * each);
      std::copy_n(b.at("next").data<std::int64_t>().data(), each,
                  all.data<std::int64_t>().data() + ((t - 1) * 2 + 1) * each);
    }
    write_npy(dir.path() / "batches.npy", all);
  }
  BenchResult r{.case_name = "gpt_text",
                .backend = "threads",
                .mesh = "2",
                .devices = 2,
                .bytes = c.batch * c.seq * c.width * 4};
  std::vector<double> losses;
  TrainOptions options{.steps = steps,
                       .optimizer = resolve_optimizer(
                           {.kind = OptimizerKind::kAdamW, .lr = lr, .clip_grad_norm = 1.0})};
  options.run.threads_per_device = 1;
  options.progress = [&](const StepReport& s) {
    losses.push_back(s.loss);
    if (s.step > o.warmup) r.case_s.push_back(s.seconds);
  };
  train_model(m, options);
  r.extra["steps"] = steps;
  r.extra["loss"] = losses.back();
  r.extra["model"] =
      "GPT: 2 blocks, width 128, 4 heads, context 128, batch 16, bytes, --init gpt2, AdamW lr "
      "3e-3, clip 1, data parallel; Debian's fortunes";
  if (o.pytorch) {
    const std::optional<nlohmann::json> j =
        run_command({"/usr/bin/python3", "-c", nanogpt_loop(c, dir.path(), steps, lr)},
                    {"OMP_NUM_THREADS=2"})
            .json();
    if (j && j->is_array() && static_cast<int>(j->size()) == steps) {
      r.baseline = "pytorch";
      for (int t = o.warmup; t < steps; ++t) r.baseline_s.push_back((*j)[t][0].get<double>());
      const double theirs = (*j)[steps - 1][1].get<double>();
      r.extra["pytorch_loss"] = theirs;
      r.extra["loss_diff"] = std::abs(losses.back() - theirs);
      r.extra["pytorch_threads"] = 2;
    }
  }
  return r;
}

// torch_gpt: examples/torch/gpt.py at the bench GPT's size (its q/k/v fused, biases, tied
// embeddings) converted by from_torch, data parallel on `mesh_text`, AdamW, against the same
// module trained by PyTorch eager on the same batches with the devices' threads together.
std::optional<BenchResult> torch_gpt_case(const TrainBenchOptions& o,
                                          const std::string& mesh_text) {
  const int devices = static_cast<int>(size(parse_mesh(mesh_text)));
  const int threads = devices * device_threads(o, devices);
  const TempFolder dir("meshflow_torch_gpt");
  const std::optional<TorchGpt> t = convert_torch_gpt(
      {.config = o.gpt, .mesh = mesh_text, .threads = threads, .steps = o.reps, .warmup = o.warmup},
      dir.path());
  if (!t) return std::nullopt;
  const Model m = load_model(t->model);
  BenchResult r{.case_name = "torch_gpt",
                .backend = "threads",
                .mesh = mesh_text,
                .devices = devices,
                .bytes = o.gpt.batch * o.gpt.seq * o.gpt.width * 4};
  const Optimizer optimizer = resolve_optimizer({.kind = OptimizerKind::kAdamW});
  ProductFloor products(training_tasks(m, optimizer, 1), 1, device_threads(o, devices));
  time_training(m, o, optimizer, weight_bytes(m), r, 1, &products);
  r.extra["floor_products"] = products.products();
  r.baseline = "pytorch";
  r.baseline_s = t->pytorch_s;
  r.extra["pytorch_threads"] = threads;
  r.extra["convert_s"] = t->convert_s;
  r.extra["convert_12_blocks_s"] = t->convert_12_blocks_s;
  r.extra["model"] = fmt::format(
      "examples/torch/gpt.py converted by from_torch: {} blocks, width {}, {} heads, sequence {}, "
      "batch {}, vocabulary {}, fused q/k/v, biases, tied embeddings, AdamW, data parallel",
      o.gpt.blocks, o.gpt.width, o.gpt.heads, o.gpt.seq, o.gpt.batch, o.gpt.vocab);
  return r;
}

BenchResult compile_case(const TrainBenchOptions& o) {
  const Pcg g = deep_mlp(o.layers);
  BenchResult r{
      .case_name = "compile", .backend = "host", .mesh = "8x8", .devices = 64, .bytes = 0};
  std::size_t tasks = 0, nodes = 0;
  std::vector<double> teardown;
  for (int rep = -o.warmup; rep < o.reps; ++rep) {
    // Timed until the task graph exists, as a run has it; freeing it (half a million tasks)
    // is the run's end, timed on its own.
    std::optional<Pcg> c;
    std::optional<TaskGraph> t;
    const double s = time_once([&] {
      c = compile(g, Mode::kTrain);
      t = expand_shards(*c, {});
    });
    nodes = c->nodes.size();
    tasks = 0;
    for (const DeviceTasks& dt : t->devices) tasks += dt.tasks.size();
    const double freed = time_once([&] {
      t.reset();
      c.reset();
    });
    if (rep >= 0) {
      r.case_s.push_back(s);
      teardown.push_back(freed);
    }
  }
  r.extra["teardown_s"] = median(teardown);
  r.extra["layers"] = o.layers;
  r.extra["nodes"] = nodes;
  r.extra["tasks"] = tasks;
  r.extra["target_s"] = 1.0;
  return r;
}

}  // namespace

BenchReport run_train_bench(const TrainBenchOptions& o) {
  check_gpt_config(o.gpt);
  BenchReport report{.benchmark = "train", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const fs::path labels =
      fs::temp_directory_path() / fmt::format("meshflow_labels_{}.npy", ::getpid());
  Tensor y(DType::kInt64, {o.batch});
  for (std::int64_t i = 0; i < o.batch; ++i) y.data<std::int64_t>()[i] = (i * 7919) % o.in;
  write_npy(labels, y);
  auto remove = [&] { fs::remove(labels); };
  auto wanted = [&](std::string_view name) {
    return o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), name) != o.cases.end();
  };
  try {
    if (wanted("train_step")) {
      for (const std::string& mesh : o.meshes) add_result(report, train_step_case(o, mesh, labels));
    }
    if (wanted("mlp_step_data")) {
      const TempFolder dir("meshflow_mlp_data");
      for (const std::string& mesh : o.meshes) {
        add_result(report, data_case(o, "mlp_step_data", mlp(o, mesh, labels),
                                     mlp_on_data(o, mesh, labels, dir.path()), mesh,
                                     (o.batch * o.in + 2 * o.in * o.hidden) * 4,
                                     resolve_optimizer({.lr = 0.01})));
      }
    }
    if (wanted("mlp_step_micro4")) {
      add_result(report, micro_case(o, "mlp_step_micro4", mlp(o, "1", labels), "1",
                                    (o.batch * o.in + 2 * o.in * o.hidden) * 4));
    }
    for (int zero : {1, 3}) {
      const std::string name = fmt::format("mlp_step_adamw_zero{}", zero);
      if (wanted(name)) add_result(report, zero_case(o, name, mlp(o, "4", labels), zero));
    }
    for (const std::string& mesh : o.gpt_meshes) {
      std::optional<BenchResult> sgd, adamw;
      if (wanted("gpt_step")) sgd = gpt_step_case(o, mesh, OptimizerKind::kSgd);
      if (wanted("gpt_step_adamw")) adamw = gpt_step_case(o, mesh, OptimizerKind::kAdamW);
      // AdamW's cost relative to PyTorch's against the rest of the step's (the issue's target:
      // at most 1.05).
      if (sgd && adamw && adamw->baseline && sgd->baseline) {
        const double a = median(adamw->case_s) / median(adamw->baseline_s);
        const double s = median(sgd->case_s) / median(sgd->baseline_s);
        adamw->extra["vs_baseline_over_gpt_step"] = a / s;
      }
      if (sgd) add_result(report, std::move(*sgd));
      if (adamw) add_result(report, std::move(*adamw));
      for (Recompute policy : {Recompute::kSelective, Recompute::kFull}) {
        if (wanted(fmt::format("gpt_step_{}", to_string(policy))))
          add_result(report, recompute_case(o, mesh, policy));
      }
    }
    if (wanted("gpt_step_data")) {
      for (const std::string& mesh : o.gpt_meshes) {
        const int devices = static_cast<int>(size(parse_mesh(mesh)));
        const GptFiles files(o.gpt, devices);
        const std::string layout = devices == 1 ? "one" : "dp";
        add_result(
            report,
            data_case(o, "gpt_step_data", files.load(layout), files.load(layout + "_data"), mesh,
                      o.gpt.batch * o.gpt.seq * o.gpt.width * 4, resolve_optimizer({.lr = 0.01})));
      }
    }
    if (wanted("gpt_step_micro4")) {
      const GptFiles files(o.gpt, 1);
      add_result(report, micro_case(o, "gpt_step_micro4", files.load("one"), "1",
                                    o.gpt.batch * o.gpt.seq * o.gpt.width * 4));
    }
    if (wanted("gpt_sp_bytes")) add_result(report, gpt_sp_bytes_case(o));
    if (wanted("torch_gpt")) {
      for (const std::string& mesh : o.gpt_meshes)
        if (std::optional<BenchResult> r = torch_gpt_case(o, mesh))
          add_result(report, std::move(*r));
    }
    if (wanted("gpt_text"))
      if (std::optional<BenchResult> text = gpt_text_case(o)) add_result(report, std::move(*text));
  } catch (...) {
    remove();
    throw;
  }
  remove();
  if (wanted("compile")) add_result(report, compile_case(o));
  return report;
}

}  // namespace meshflow::bench
