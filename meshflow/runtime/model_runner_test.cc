// Models run and trained across devices against the whole-tensor reference (graph/reference.h):
// each parallel op forward and backward, same mesh and between meshes of different sizes, with
// uneven shards; the communication of data parallelism counted by the recording communicator;
// results identical run to run; --save and --trace outputs.
#include "meshflow/runtime/model_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "meshflow/core/compare.h"
#include "meshflow/core/file.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/reference.h"
#include "meshflow/graph/testing.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/mesh/sharding.h"
#include "meshflow/train/trainer.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

// A weight x on `from`, parallel ops `ops` (each with its output mesh and placements), then
// relu and an mse against a target on the last op's layout: x's gradient flows back through
// every parallel op's backward.
struct ParallelCase {
  std::string name;
  Shape shape;
  std::string from, from_placements;
  struct Step {
    ParallelOp op;
    std::string mesh, placements;
  };
  std::vector<Step> steps;
};

Model parallel_model(const ParallelCase& c) {
  Model m;
  Pcg& g = m.pcg;
  ValueId v = add_weight(g, "x", {c.shape}, parse_mesh(c.from), parse_placements(c.from_placements),
                         Source::normal(1, 5));
  std::string mesh = c.from, placements = c.from_placements;
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    const auto& s = c.steps[i];
    v = add_parallel(g, "p" + std::to_string(i), s.op, v, parse_mesh(s.mesh),
                     parse_placements(s.placements));
    mesh = s.mesh;
    placements = s.placements;
  }
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kRelu}, {v});
  const ValueId t = add_input(g, "t", {c.shape}, parse_mesh(mesh), parse_placements(placements),
                              Source::normal(1, 6));
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {a, t}));
  add_output(g, a);
  return m;
}

void expect_matches_one_device(const Model& m, const std::string& what, bool overlap = false,
                               std::optional<GatherForm> gather_form = std::nullopt) {
  TrainOptions o{.steps = 2, .optimizer = {.lr = 0.5}, .check = true};
  o.run.overlap = overlap;
  o.run.gather_form = gather_form;
  o.run.overlap_always = overlap;  // these graphs are too small for the cost model to choose it
  const TrainReport r = train_model(m, o);
  ASSERT_TRUE(r.check.has_value());
  EXPECT_LE(r.check->max_loss_diff, 1e-6) << what;
  EXPECT_LE(r.check->max_weight_diff, 1e-6) << what;
  EXPECT_LE(r.check->max_grad_diff, 1e-6) << what;
  EXPECT_GT(r.steps[0].loss, r.steps[1].loss) << what << ": SGD lowers the loss";
}

using PT = ParallelType;

TEST(ParallelOps, ForwardAndBackwardEqualOneDevice) {
  const std::vector<ParallelCase> cases = {
      {"repartition same mesh, uneven",
       {7, 5},
       "2x2",
       "R,R",
       {{{PT::kRepartition, 0, 2}, "2x2", "S(0),R"}}},
      {"repartition one -> two devices",
       {5, 3},
       "1",
       "R",
       {{{PT::kRepartition, 0, 2}, "2", "S(0)"}}},
      {"repartition two -> four devices",
       {9, 2},
       "2",
       "S(0)",
       {{{PT::kRepartition, 0, 2}, "4", "S(0)"}}},
      {"combine same mesh, uneven", {5, 7}, "3", "S(1)", {{{PT::kCombine, 1, 3}, "3", "R"}}},
      {"combine two -> one device", {5, 3}, "2", "S(0)", {{{PT::kCombine, 0, 2}, "1", "R"}}},
      {"replicate one -> two devices", {5, 3}, "1", "R", {{{PT::kReplicate, 0, 2}, "2", "R"}}},
      {"repartition then combine across meshes",
       {6, 4},
       "1",
       "R",
       {{{PT::kRepartition, 0, 2}, "2@1,2", "S(0)"}, {{PT::kCombine, 0, 2}, "1@3", "R"}}},
  };
  for (const ParallelCase& c : cases) expect_matches_one_device(parallel_model(c), c.name);
}

TEST(ParallelOps, ReductionSameMeshAndAcrossMeshes) {
  for (const std::string to : {"2", "1"}) {
    Model m;
    Pcg& g = m.pcg;
    const DeviceMesh two = parse_mesh("2");
    const ValueId x =
        add_weight(g, "x", {{5, 6}}, two, parse_placements("S(1)"), Source::normal(1, 1));
    const ValueId w =
        add_weight(g, "w", {{6, 3}}, two, parse_placements("S(0)"), Source::normal(1, 2));
    const ValueId l = add_compute(g, "l", Op{.type = OpType::kLinear}, {x, w});
    const ValueId r = add_parallel(g, "r", ParallelOp{.type = PT::kReduction, .degree = 2}, l,
                                   parse_mesh(to), parse_placements("R"));
    const ValueId a = add_compute(g, "a", Op{.type = OpType::kTanh}, {r});
    const ValueId t =
        add_input(g, "t", {{5, 3}}, parse_mesh(to), parse_placements("R"), Source::normal(1, 3));
    set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {a, t}));
    expect_matches_one_device(m, "reduction to mesh " + to);
  }
}

// Data parallelism over 4 devices: x and t S(0), weights R.
Model data_parallel() {
  Model m;
  Pcg& g = m.pcg;
  const DeviceMesh mesh = parse_mesh("4");
  auto P = parse_placements;
  const ValueId x = add_input(g, "x", {{8, 6}}, mesh, P("S(0)"), Source::normal(1, 1));
  const ValueId t = add_input(g, "t", {{8, 3}}, mesh, P("S(0)"), Source::normal(1, 2));
  const ValueId w1 = add_weight(g, "w1", {{6, 8}}, mesh, P("R"), Source::normal(0.3, 3));
  const ValueId b1 = add_weight(g, "b1", {{8}}, mesh, P("R"), Source::normal(0.1, 4));
  const ValueId w2 = add_weight(g, "w2", {{8, 3}}, mesh, P("R"), Source::normal(0.3, 5));
  const ValueId h = add_compute(g, "h", Op{.type = OpType::kLinear}, {x, w1, b1});
  const ValueId a = add_compute(g, "a", Op{.type = OpType::kTanh}, {h});
  const ValueId o = add_compute(g, "o", Op{.type = OpType::kLinear}, {a, w2});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kMse}, {o, t}));
  return m;
}

// Returns true for the update's reduction of the squared gradient norm: one float64 term per
// device (the planner moves so few bytes as point-to-point boxes, each device summing them).
bool is_norm_reduction(const RecordedCall& call) {
  return call.dtype == DType::kFloat64 &&
         std::all_of(call.counts.begin(), call.counts.end(), [](auto c) { return c == 1; });
}

TEST(TaskRuntime, DataParallelismReducesEachGradientOnceAndMovesNothingElse) {
  const Model m = data_parallel();
  expect_matches_one_device(m, "data parallel");
  const Pcg g = compile(m.pcg, Mode::kTrain);
  for (const auto& [device, log] : record_calls(g)) {
    // One reduction per weight gradient (w1, b1, w2), each over the 4 devices, then the
    // squared gradient norm's (one float64), and nothing in the forward or backward passes.
    ASSERT_EQ(log.size(), 4u) << "device " << device;
    for (const RecordedCall& call : log) {
      EXPECT_EQ(call.group, first_devices(4)) << to_string(call);
    }
    EXPECT_TRUE(is_norm_reduction(log.back())) << to_string(log.back());
  }
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("meshflow_runner_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// An LM head and its loss: x[rows, width] (rows sharded over dp when dp > 1), a column-parallel
// head[width, vocab] over tp, logits = matmul(x, head) and softmax_cross_entropy against labels,
// in float64 (so one device's sums in another order agree to 1e-6).
Model lm_head(const fs::path& dir, int dp, int tp, std::int64_t rows, std::int64_t width,
              std::int64_t vocab) {
  Tensor labels(DType::kInt64, {rows});
  for (std::int64_t i = 0; i < rows; ++i)
    labels.data<std::int64_t>()[static_cast<std::size_t>(i)] = (i * 977 + 13) % vocab;
  write_npy(dir / "labels.npy", labels);
  Model m;
  Pcg& g = m.pcg;
  const bool two_d = dp > 1;
  const DeviceMesh mesh = parse_mesh(two_d ? fmt::format("{}x{}", dp, tp) : fmt::format("{}", tp));
  auto P = [&](std::string_view rows_dim, std::string_view cols_dim) {
    return parse_placements(two_d ? fmt::format("{},{}", rows_dim, cols_dim)
                                  : std::string(cols_dim));
  };
  const ValueId x = add_input(g, "x", {{rows, width}, DType::kFloat64}, mesh, P("S(0)", "R"),
                              Source::normal(1, 3));
  const ValueId head = add_weight(g, "head", {{width, vocab}, DType::kFloat64}, mesh,
                                  P("R", "S(1)"), Source::normal(0.5, 4));
  const ValueId y = add_input(g, "labels", {{rows}, DType::kInt64}, mesh, P("S(0)", "R"),
                              {.kind = Source::Kind::kNpy, .path = dir / "labels.npy"});
  const ValueId logits = add_compute(g, "logits", Op{.type = OpType::kMatmul}, {x, head});
  set_loss(g, add_compute(g, "loss", Op{.type = OpType::kSoftmaxCrossEntropy}, {logits, y}));
  return m;
}

TEST(TaskRuntime, AVocabularyParallelLossMovesOnlyItsRowStatistics) {
  const fs::path dir = temp_dir("vocab");
  for (const auto& [dp, tp] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}}) {
    const std::string what = fmt::format("dp {} tp {}", dp, tp);
    // 2 MiB of logits: two all-reduces of the rows' statistics cost less than gathering them.
    const std::int64_t rows = 256, vocab = 2048 + 3;  // uneven class shards
    const Model m = lm_head(dir, dp, tp, rows, 16, vocab);
    expect_matches_one_device(m, what);
    const Pcg g = compile(m.pcg, Mode::kTrain);
    // The gradient reuses the forward's statistics.
    std::vector<std::string> steps;
    for (const Node& n : g.nodes)
      if (n.kind == NodeKind::kCompute && n.phase != Phase::kUpdate)
        steps.push_back(fmt::format("{} = {}", n.name, to_string(n.op)));
    EXPECT_EQ(fmt::format("{}", fmt::join(steps, "; ")),
              "logits = matmul; loss:max:kernel = logit_max; loss:stats:kernel = logit_stats; loss "
              "= cross_entropy_from_stats; bwd:loss/0 = cross_entropy_grad_from_stats; "
              "bwd:logits/1 = matmul_grad_b")
        << what;
    for (const auto& [device, log] : record_calls(g)) {
      // Per step: the max and the (sum, picked) pairs of this device's rows, all-reduced over
      // tp (by whichever algorithm the planner picks for their size), and with dp > 1 the head
      // gradient's all-reduce over dp; never the logits.
      const std::int64_t head_local = 16 * (device % tp == tp - 1 ? vocab / tp : vocab / tp + 1);
      int statistics_calls = 0, head_reductions = 0, norm_reductions = 0;
      for (const RecordedCall& call : log) {
        if (is_norm_reduction(call)) {
          ++norm_reductions;
          EXPECT_EQ(call.group, first_devices(dp * tp)) << to_string(call);
          continue;
        }
        std::int64_t elements = 0;
        for (std::int64_t c : call.counts) elements += c;
        if (call.collective == "all_reduce" && elements == head_local) {
          ++head_reductions;
          EXPECT_EQ(call.group.size(), static_cast<std::size_t>(dp)) << to_string(call);
        } else {
          ++statistics_calls;
          EXPECT_LE(elements, tp * 2 * rows / dp) << to_string(call);
        }
      }
      EXPECT_EQ(statistics_calls, 2) << what << " device " << device;
      EXPECT_EQ(head_reductions, dp > 1 ? 1 : 0) << what << " device " << device;
      EXPECT_EQ(norm_reductions, 1) << what << " device " << device;
    }
  }
  fs::remove_all(dir);
}

Model dp_tp(const fs::path& dir) {
  Tensor labels(DType::kInt64, {8});
  for (std::int64_t i = 0; i < 8; ++i) labels.data<std::int64_t>()[i] = (i * 7) % 4;
  write_npy(dir / "labels.npy", labels);
  return Model{.pcg = testing::dp_tp_mlp(dir / "labels.npy")};
}

TEST(TaskRuntime, ResultsAreIdenticalRunToRun) {
  const fs::path dir = temp_dir("repeat");
  const Model m = dp_tp(dir);
  const TrainReport a = train_model(m, {.steps = 3});
  const TrainReport b = train_model(m, {.steps = 3});
  ASSERT_EQ(a.steps.size(), 3u);
  for (std::size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss);
  fs::remove_all(dir);
}

TEST(Overlap, TrainingWithDecomposedCollectivesEqualsOneDeviceAndThePlainRun) {
  for (const auto& [dp, tp] :
       std::vector<std::pair<int, int>>{{1, 2}, {1, 3}, {1, 4}, {1, 8}, {2, 2}}) {
    // Uneven row blocks (batch 2 tp + 1) and column blocks (hidden 4 tp + 1 does not split
    // evenly over tp... nor need it: the chunk rule).
    const Model m{.pcg = testing::sp_mlp(dp, tp, 2 * tp + 1, 5, 4 * tp + 1)};
    TrainOptions plain{.steps = 2, .optimizer = {.lr = 0.5}};
    const TrainReport a = train_model(m, plain);
    // Every collective decomposed: in the cost model's form on threads (in place), and in the
    // two forms that move blocks.
    for (std::optional<GatherForm> form :
         {std::optional<GatherForm>{}, std::optional{GatherForm::kPermute},
          std::optional{GatherForm::kBroadcast}}) {
      const std::string what =
          fmt::format("dp {} tp {} gather {}", dp, tp, form ? to_string(*form) : "chosen");
      expect_matches_one_device(m, what, /*overlap=*/true, form);
      TrainOptions overlapped = plain;
      overlapped.run.overlap = true;
      overlapped.run.gather_form = form;
      overlapped.run.overlap_always = true;
      const TrainReport b = train_model(m, overlapped);
      for (std::size_t i = 0; i < a.steps.size(); ++i)
        EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, 1e-6) << what;
    }
  }
}

// On a machine whose copies take the computing cores, plain --overlap on threads decomposes
// only into the in-place loops (nothing copied): gathers read blocks where they lie and
// reduce-scatters add each term into its owner's result. Training still equals one device.
TEST(Overlap, WhereCopiesTakeTheCoresTheLoopsRunInPlaceAndTrainingEqualsOneDevice) {
  MachineModel slow{
      .links = {{"l",
                 LinkClass{.bandwidth_gbps = 0.001, .latency_us = 0, .copies_on_cores = true}}},
      .default_link = "l",
      .memcpy_gbps = 1,
      .collective_overhead_us = 0,
      .local_step_us = 0,
      .gemm_gflops = 0.001,
      .elementwise_gbps = 1};
  for (const auto& [dp, tp] : std::vector<std::pair<int, int>>{{1, 3}, {1, 4}, {2, 2}}) {
    const Model m{.pcg = testing::sp_mlp(dp, tp, 2 * tp + 1, 5, 4 * tp + 1)};
    const Pcg g = compile(
        m.pcg, Mode::kTrain,
        {.plan = {.machine = &slow}, .overlap = true, .decompose = {.shared_memory = true}});
    std::vector<std::string> forms;
    for (const Node& n : g.nodes)
      if (n.decomposed) forms.emplace_back(to_string(n.decomposed->form));
    EXPECT_EQ(forms, std::vector<std::string>(4, "in_place")) << "dp " << dp << " tp " << tp;
    TrainOptions o{.steps = 2, .optimizer = {.lr = 0.5}, .check = true};
    o.run.plan.machine = &slow;
    o.run.overlap = true;
    const TrainReport r = train_model(m, o);
    ASSERT_TRUE(r.check.has_value());
    EXPECT_LE(r.check->max_loss_diff, 1e-6) << "dp " << dp << " tp " << tp;
    EXPECT_LE(r.check->max_weight_diff, 1e-6) << "dp " << dp << " tp " << tp;
    EXPECT_LE(r.check->max_grad_diff, 1e-6) << "dp " << dp << " tp " << tp;
  }
}

TEST(Overlap, TracesShowEachBlocksTransferOverlappingAProduct) {
  const fs::path dir = temp_dir("overlap_trace");
  // The permute form (on threads the cost model would read gathered blocks in place).
  ModelRunOptions o{.overlap = true, .gather_form = GatherForm::kPermute, .overlap_always = true};
  o.trace = dir / "trace.json";
  run_model(Model{.pcg = testing::sp_mlp(1, 4, 64, 32, 64)}, o);
  const auto trace = nlohmann::json::parse(read_file(dir / "trace.json"));
  // Per device: transfers on its second track (tid 1), products on its first, and some
  // transfer in flight while a product ran.
  std::map<int, std::vector<std::pair<double, double>>> transfers, products;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::pair<double, double> span{e["ts"].get<double>(),
                                         e["ts"].get<double>() + e["dur"].get<double>()};
    if (e["cat"] == "transfer") {
      EXPECT_EQ(e["tid"], 1);
      transfers[e["pid"].get<int>()].push_back(span);
    }
    if (e["cat"] == "product") {
      EXPECT_EQ(e["tid"], 0);
      products[e["pid"].get<int>()].push_back(span);
    }
  }
  ASSERT_EQ(transfers.size(), 4u);
  for (const auto& [device, spans] : transfers) {
    // The forward's gather (3 permutes) and scatter (3): six transfers, eight products.
    EXPECT_EQ(spans.size(), 6u) << "device " << device;
    EXPECT_EQ(products[device].size(), 8u) << "device " << device;
    int overlapping = 0;
    for (const auto& t : spans)
      for (const auto& p : products[device])
        overlapping += p.first >= t.first && p.second <= t.second;
    EXPECT_GE(overlapping, 4) << "device " << device;
  }
  fs::remove_all(dir);
}

TEST(ModelRunner, SaveWritesEachOutputInItsLayoutAndTraceHasATrackPerDevice) {
  const fs::path dir = temp_dir("save");
  const Model m = dp_tp(dir);
  ModelRunOptions o;
  o.save = dir / "out";
  o.trace = dir / "trace.json";
  const RunReport r = run_model(m, o);
  ASSERT_EQ(r.outputs.size(), 2u);
  ReferenceModel ref = reference_load(m.pcg);
  reference_forward(ref);
  for (const auto& [name, layout] : r.outputs) {
    const ShardedTensor t = read_sharded(dir / "out" / name);
    EXPECT_EQ(t.layout, layout);
    const Tensor& want = ref.values[static_cast<std::size_t>(find_value(m.pcg, name))];
    EXPECT_EQ(compare_close(assemble(t.layout, t.shards), want, 1e-5, 1e-6), std::nullopt) << name;
  }
  const auto trace = nlohmann::json::parse(read_file(dir / "trace.json"));
  std::set<int> tracks, with_events;  // a process per device
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") tracks.insert(e["pid"].get<int>());
    if (e["ph"] == "X") with_events.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(tracks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(with_events, tracks);
  // Every task gives its device thread's CPU time, at most its span; a kernel's is not zero.
  double computed_ms = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ASSERT_TRUE(e["args"].contains("cpu_ms")) << e.dump();
    const double cpu_ms = e["args"]["cpu_ms"].get<double>();
    EXPECT_GE(cpu_ms, 0.0) << e.dump();
    EXPECT_LE(cpu_ms, e["dur"].get<double>() / 1e3 + 0.05) << e.dump();
    if (e["cat"] == "compute") computed_ms += cpu_ms;
  }
  EXPECT_GT(computed_ms, 0.0);
  // A second run replaces the folder; a folder of anything else is refused and left alone.
  EXPECT_NO_THROW(run_model(m, o));
  fs::create_directories(dir / "precious");
  std::ofstream(dir / "precious" / "notes.txt") << "keep me";
  o.save = dir / "precious";
  o.trace = std::nullopt;
  try {
    run_model(m, o);
    ADD_FAILURE() << "a folder of other files was replaced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refusing to replace"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(dir / "precious" / "notes.txt"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshflow
