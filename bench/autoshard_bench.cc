// `meshflow bench autoshard` (bench/autoshard_bench.h).
#include "bench/autoshard_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "bench/collectives_bench.h"
#include "meshflow/auto/autoshard.h"
#include "meshflow/core/error.h"
#include "meshflow/core/file.h"
#include "meshflow/core/json_field.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/explain.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/train/trainer.h"

namespace meshflow::bench {

namespace {

namespace fs = std::filesystem;

// A layout written by hand: its model file and the ZeRO level it trains at.
struct HandLayout {
  std::string name;
  nlohmann::json model;
  int zero = 0;
};

nlohmann::json read_json(const fs::path& path) {
  return parse_json(read_file(path), path.string());
}

// The model `j` on `mesh` (its text) instead of a 1-d mesh of as many devices: every placement
// list [p] becomes one p per mesh dim (a tensor dim sharded over every mesh dim is sharded
// over all the devices); a list with a placement per mesh dim already (DP×TP's) stays.
nlohmann::json on_mesh(nlohmann::json j, const std::string& mesh) {
  const auto dims = static_cast<std::size_t>(ndim(parse_mesh(mesh)));
  for (auto& [name, m] : j["meshes"].items()) m = mesh;
  auto lift = [&](nlohmann::json& o) {
    if (o.contains("placements") && o["placements"].size() == 1)
      o["placements"] = nlohmann::json(std::vector<nlohmann::json>(dims, o["placements"][0]));
  };
  for (auto& [name, t] : j["tensors"].items()) lift(t);
  for (auto& n : j["nodes"]) lift(n);
  return j;
}

// The MLP on a 1-d mesh of `devices`, every tensor replicated; its labels written into `folder`.
nlohmann::json mlp(const AutoshardBenchOptions& o, int devices, const fs::path& folder) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> label(0, o.in - 1);
  Tensor y(DType::kInt64, {o.batch});
  for (std::int64_t i = 0; i < o.batch; ++i)
    y.data<std::int64_t>()[static_cast<std::size_t>(i)] = label(rng);
  write_npy(folder / "y.npy", y);
  auto tensor = [](std::vector<std::int64_t> shape, nlohmann::json source, bool weight) {
    return nlohmann::json{{"shape", shape},
                          {weight ? "weight" : "input", source},
                          {"mesh", "m"},
                          {"placements", {"R"}}};
  };
  nlohmann::json t = {{"x", tensor({o.batch, o.in}, {{"normal", 1.0}, {"seed", 1}}, false)},
                      {"y", tensor({o.batch}, "y.npy", false)},
                      {"w1", tensor({o.in, o.hidden}, {{"normal", 0.02}, {"seed", 2}}, true)},
                      {"b1", tensor({o.hidden}, {{"normal", 0.02}, {"seed", 3}}, true)},
                      {"w2", tensor({o.hidden, o.in}, {{"normal", 0.02}, {"seed", 4}}, true)},
                      {"b2", tensor({o.in}, {{"normal", 0.02}, {"seed", 5}}, true)}};
  t["y"]["dtype"] = "int64";
  return {{"meshes", {{"m", std::to_string(devices)}}},
          {"tensors", t},
          {"nodes",
           {{{"name", "h"}, {"op", "linear"}, {"inputs", {"x", "w1", "b1"}}},
            {{"name", "a"}, {"op", "relu"}, {"inputs", {"h"}}},
            {{"name", "o"}, {"op", "linear"}, {"inputs", {"a", "w2", "b2"}}},
            {{"name", "loss"}, {"op", "softmax_cross_entropy"}, {"inputs", {"o", "y"}}}}},
          {"loss", "loss"},
          {"outputs", {"loss"}}};
}

nlohmann::json placed(nlohmann::json j, const std::map<std::string, std::string>& placements) {
  for (const auto& [name, p] : placements) j["tensors"][name]["placements"] = {p};
  return j;
}

// The MLP's hand layouts on a 1-d mesh: data parallel (at ZeRO 0, 1 and 3), Megatron's tensor
// parallel, it with the inputs split by rows (gathered into the first product), replicated.
std::vector<HandLayout> mlp_layouts(const nlohmann::json& base) {
  const std::map<std::string, std::string> dp = {{"x", "S(0)"}, {"y", "S(0)"}};
  const std::map<std::string, std::string> tp = {{"w1", "S(1)"}, {"b1", "S(0)"}, {"w2", "S(0)"}};
  std::map<std::string, std::string> tp_sp = tp;
  tp_sp.insert(dp.begin(), dp.end());
  return {{"dp", placed(base, dp), 0},       {"dp_zero1", placed(base, dp), 1},
          {"fsdp", placed(base, dp), 3},     {"tp", placed(base, tp), 0},
          {"tp_sp", placed(base, tp_sp), 0}, {"replicated", base, 0}};
}

// The same layouts on `mesh`.
std::vector<HandLayout> on_mesh(const std::vector<HandLayout>& layouts, const std::string& mesh) {
  std::vector<HandLayout> out;
  for (const HandLayout& l : layouts) out.push_back({l.name, on_mesh(l.model, mesh), l.zero});
  return out;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t i, std::size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < order.size();) {
      std::size_t j = i;
      while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
      for (std::size_t k = i; k <= j; ++k) r[order[k]] = (static_cast<double>(i + j) / 2);
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

struct Measured {
  std::vector<double> step_s;
  double est_s = 0;
};

// Trains model file `path` for warmup + reps steps (threads) and prices it as explain does.
Measured measure(const AutoshardBenchOptions& o, const fs::path& path, int zero, int micro_batches,
                 const MachineModel* machine) {
  const Model m = load_model(path);
  Measured r;
  TrainOptions options{.steps = o.warmup + o.reps, .micro_batches = micro_batches, .zero = zero};
  options.run.plan.machine = machine;
  const TrainReport t = train_model(m, options);
  for (std::size_t i = static_cast<std::size_t>(o.warmup); i < t.steps.size(); ++i)
    r.step_s.push_back(t.steps[i].seconds);
  const Explanation e = explain_compiled(m.pcg, {.plan = {.machine = machine},
                                                 .decompose = {.shared_memory = true},
                                                 .update = options.optimizer.rule,
                                                 .micro_batches = micro_batches,
                                                 .zero = zero});
  r.est_s = e.step_time ? e.step_time->total() : 0;
  return r;
}

void write(const fs::path& path, const nlohmann::json& j) { write_file_atomic(path, j.dump()); }

// One case: the chosen layout against the hand layouts of `model` on `mesh`, each with its
// steps as they are timed.
struct LayoutCase {
  struct Entry {
    std::string name;
    fs::path path;
    int zero = 0, micro_batches = 1;
    std::vector<double> step_s;
    double est_s = 0;
  };
  std::string model, mesh;
  const MachineModel* machine = nullptr;
  std::string machine_source;  // which description `machine` is
  std::vector<Entry> entries;  // the hand layouts, then the chosen one
  AutoshardResult chosen;
};

// Writes the hand layouts of `model` on `mesh` and the one autoshard chooses; times nothing.
LayoutCase prepare_case(const std::string& model, const std::string& mesh,
                        const std::vector<HandLayout>& hand, const fs::path& folder,
                        const MachineModel* machine) {
  LayoutCase c{.model = model, .mesh = mesh, .machine = machine};
  for (const HandLayout& l : hand) {
    const fs::path path = folder / fmt::format("{}_{}_{}.json", model, mesh, l.name);
    write(path, l.model);
    c.entries.push_back({l.name, path, l.zero});
  }
  // The search starts from the data-parallel file (its own placements are a candidate).
  c.chosen = autoshard(c.entries[0].path, {.mesh = mesh, .plan = {.machine = machine}}, folder);
  const fs::path chosen = folder / fmt::format("{}_{}_auto.json", model, mesh);
  write(chosen, c.chosen.model);
  c.entries.push_back({"auto", chosen, c.chosen.zero, c.chosen.micro_batches});
  return c;
}

// Times every layout of every case: `reps` rounds, each training every layout on every mesh
// once (a warm-up step and a timed one), so that a machine whose speed drifts during the run
// treats the layouts and the meshes alike (the rank correlation pools the meshes).
void time_cases(const AutoshardBenchOptions& o, std::vector<LayoutCase>& cases,
                const BenchReport& report) {
  AutoshardBenchOptions one_step = o;
  one_step.reps = 1;
  for (int round = 0; round < o.reps; ++round) {
    print_progress(report,
                   fmt::format("{}: round {} of {}", cases.front().model, round + 1, o.reps));
    for (LayoutCase& c : cases) {
      for (LayoutCase::Entry& e : c.entries) {
        const Measured m = measure(one_step, e.path, e.zero, e.micro_batches, c.machine);
        e.step_s.push_back(m.step_s.at(0));
        e.est_s = m.est_s;
      }
    }
  }
}

// The case's result; appends each layout's estimate and measured median.
BenchResult layout_result(const LayoutCase& c, std::vector<double>& estimates,
                          std::vector<double>& measured) {
  BenchResult r{.case_name = c.model + " " + c.mesh,
                .backend = "threads",
                .mesh = c.mesh,
                .devices = size(parse_mesh(c.mesh)),
                .baseline = "best_hand_layout"};
  const AutoshardResult& a = c.chosen;
  nlohmann::json layouts = nlohmann::json::object();
  std::string best;
  double best_s = 0;
  for (const LayoutCase::Entry& e : c.entries) {
    const double step = median(e.step_s);
    const auto [least, most] = std::minmax_element(e.step_s.begin(), e.step_s.end());
    layouts[e.name] = {
        {"median_s", step},      {"min_s", *least},
        {"max_s", *most},        {"step_s", e.step_s},
        {"est_step_s", e.est_s}, {"est_vs_measured", step > 0 ? e.est_s / step : 0.0},
        {"zero", e.zero}};
    estimates.push_back(e.est_s);
    measured.push_back(step);
    if (e.name == "auto") continue;
    if (best.empty() || step < best_s) best = e.name, best_s = step, r.baseline_s = e.step_s;
  }
  r.case_s = c.entries.back().step_s;
  layouts["auto"]["micro_batches"] = a.micro_batches;
  r.extra["best_hand_layout"] = best;
  r.extra["est_step_s"] = a.est_step_s;
  r.extra["est_vs_measured"] = layouts["auto"]["est_vs_measured"];
  r.extra["machine"] = c.machine_source;
  r.extra["given_est_step_s"] = a.given_est_step_s ? nlohmann::json(*a.given_est_step_s) : nullptr;
  r.extra["search_s"] = a.search_s;
  r.extra["layouts"] = layouts;
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [name, layout] : a.values) values[name] = to_string(layout.placements);
  r.extra["chosen"] = values;
  return r;
}

// A chain of `layers` linear + ReLU layers of width 64 (batch 64) on a 1-device mesh.
nlohmann::json deep_mlp(int layers, const fs::path& folder) {
  Tensor y(DType::kInt64, {64});
  for (std::int64_t i = 0; i < 64; ++i)
    y.data<std::int64_t>()[static_cast<std::size_t>(i)] = (i * 7) % 64;
  write_npy(folder / "deep_y.npy", y);
  nlohmann::json t = {{"x",
                       {{"shape", {64, 64}},
                        {"input", {{"normal", 1.0}, {"seed", 1}}},
                        {"mesh", "m"},
                        {"placements", {"R"}}}},
                      {"y",
                       {{"shape", {64}},
                        {"dtype", "int64"},
                        {"input", "deep_y.npy"},
                        {"mesh", "m"},
                        {"placements", {"R"}}}}};
  nlohmann::json nodes = nlohmann::json::array();
  std::string prev = "x";
  for (int i = 0; i < layers; ++i) {
    t[fmt::format("w{}", i)] = {{"shape", {64, 64}},
                                {"weight", {{"normal", 0.1}, {"seed", i + 2}}},
                                {"mesh", "m"},
                                {"placements", {"R"}}};
    nodes.push_back({{"name", fmt::format("h{}", i)},
                     {"op", "linear"},
                     {"inputs", {prev, fmt::format("w{}", i)}}});
    nodes.push_back(
        {{"name", fmt::format("a{}", i)}, {"op", "relu"}, {"inputs", {fmt::format("h{}", i)}}});
    prev = fmt::format("a{}", i);
  }
  nodes.push_back({{"name", "loss"}, {"op", "softmax_cross_entropy"}, {"inputs", {prev, "y"}}});
  return {{"meshes", {{"m", "1"}}},
          {"tensors", t},
          {"nodes", nodes},
          {"loss", "loss"},
          {"outputs", {"loss"}}};
}

BenchResult search_case(const AutoshardBenchOptions& o, const std::string& name,
                        const fs::path& model, const std::string& mesh, const fs::path& folder) {
  BenchResult r{.case_name = "search " + name,
                .backend = "host",
                .mesh = mesh,
                .devices = size(parse_mesh(mesh))};
  std::vector<double> priced;
  for (int i = 0; i < o.reps; ++i) {
    const AutoshardResult a = autoshard(model, {.mesh = mesh}, folder);
    r.case_s.push_back(a.search_s);
    priced.push_back(a.priced_s);
    r.extra["est_step_s"] = a.est_step_s;
    r.extra["zero"] = a.zero;
    r.extra["exact"] = a.exact;
  }
  r.extra["search_s"] = median(r.case_s);
  r.extra["priced_s"] = median(priced);
  return r;
}

}  // namespace

BenchReport run_autoshard_bench(const AutoshardBenchOptions& o) {
  BenchReport report{.benchmark = "autoshard", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  TempFolder folder("meshflow_autoshard");
  for (const std::string& model : o.models) {
    if (model != "mlp" && model != "gpt")
      fail(ErrorKind::kInvalidArgument, "bench autoshard: no model \"{}\" (mlp or gpt)", model);
  }
  // Each device count's description, measured (the cache's: the median of several
  // calibrations) before anything is timed.
  std::map<int, ChosenMachine> machines;
  for (const std::string& mesh : o.meshes) {
    const int devices = size(parse_mesh(mesh));
    if (machines.contains(devices) || o.models.empty()) continue;
    machines.emplace(
        devices, o.machine ? o.machine(devices, 0) : ChosenMachine{default_machine(), "built-in"});
  }
  auto machine_for = [&](int devices) -> const MachineModel* {
    return &machines.at(devices).machine;
  };
  for (const std::string& model : o.models) {
    if (o.meshes.empty()) break;
    std::vector<LayoutCase> cases;
    std::deque<GptFiles> gpt_files;  // the cases' data files, kept until they are timed
    for (const std::string& mesh : o.meshes) {
      const int devices = size(parse_mesh(mesh));
      // DP×TP (batch over dim 0, Megatron over dim 1) where the mesh has two dims; every other
      // layout is written for a 1-d mesh of as many devices and laid on each of its dims.
      const bool two_d = ndim(parse_mesh(mesh)) == 2;
      std::vector<HandLayout> hand;
      if (model == "mlp") {
        hand = on_mesh(mlp_layouts(mlp(o, devices, folder.path())), mesh);
        if (two_d) {
          nlohmann::json dp_tp = on_mesh(mlp(o, devices, folder.path()), mesh);
          for (const auto& [t, p] :
               std::map<std::string, std::vector<std::string>>{{"x", {"S(0)", "R"}},
                                                               {"y", {"S(0)", "R"}},
                                                               {"w1", {"R", "S(1)"}},
                                                               {"b1", {"R", "S(0)"}},
                                                               {"w2", {"R", "S(0)"}}})
            dp_tp["tensors"][t]["placements"] = p;
          hand.push_back({"dp_tp", dp_tp, 0});
        }
      } else {
        const GptFiles* gpt = &gpt_files.emplace_back(o.gpt, devices);
        auto file = [&](const std::string& layout) {
          nlohmann::json j = read_json(gpt->path(layout));
          // Data paths absolute: the files are written elsewhere.
          for (auto& [name, t] : j["tensors"].items())
            if (t.contains("input") && t["input"].is_string())
              t["input"] =
                  (gpt->path(layout).parent_path() / t["input"].get<std::string>()).string();
          return on_mesh(j, mesh);
        };
        hand = {{"dp", file("dp"), 0}, {"dp_zero1", file("dp"), 1},       {"fsdp", file("dp"), 3},
                {"tp", file("tp"), 0}, {"tp_vocab", file("tp_vocab"), 0}, {"sp", file("sp"), 0}};
        if (two_d) hand.push_back({"dp_tp", file("dp_tp"), 0});
      }
      cases.push_back(prepare_case(model, mesh, hand, folder.path(), machine_for(devices)));
      cases.back().machine_source = machines.at(devices).source;
    }
    time_cases(o, cases, report);
    std::vector<double> estimates, measured;
    std::vector<BenchResult> results;
    for (const LayoutCase& c : cases) {
      std::vector<double> mesh_estimates, mesh_measured;
      results.push_back(layout_result(c, mesh_estimates, mesh_measured));
      results.back().extra["mesh_rank_correlation"] = spearman(mesh_estimates, mesh_measured);
      estimates.insert(estimates.end(), mesh_estimates.begin(), mesh_estimates.end());
      measured.insert(measured.end(), mesh_measured.begin(), mesh_measured.end());
    }
    const double rho = spearman(estimates, measured);
    for (BenchResult& r : results) {
      r.extra["rank_correlation"] = rho;
      add_result(report, std::move(r));
    }
  }
  if (o.search_cases) {
    GptConfig big = o.gpt;
    big.blocks = 12;
    const GptFiles gpt(big, 8);
    add_result(report, search_case(o, "gpt 12 blocks", gpt.path("dp"), "2x4", folder.path()));
    const fs::path deep = folder.path() / "deep_mlp.json";
    write(deep, deep_mlp(1000, folder.path()));
    add_result(report, search_case(o, "mlp 1000 layers", deep, "8x8", folder.path()));
  }
  return report;
}

}  // namespace meshflow::bench
