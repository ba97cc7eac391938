#include "meshflow/infer/generate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include "meshflow/comm/launch.h"
#include "meshflow/core/box.h"
#include "meshflow/core/clock.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/source.h"
#include "meshflow/infer/decoder_graph.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/mesh/sharded_folder.h"
#include "meshflow/runtime/task_runtime.h"

namespace meshflow {

namespace fs = std::filesystem;

fs::path weights_folder(const fs::path& given) {
  if (fs::exists(given / "checkpoint.json")) return given;
  std::optional<std::pair<long, fs::path>> newest;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(given, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("step-") || !fs::exists(e.path() / "checkpoint.json")) continue;
    char* end = nullptr;
    const long k = std::strtol(name.c_str() + 5, &end, 10);
    if (*end != '\0') continue;
    if (!newest || k > newest->first) newest = {k, e.path()};
  }
  return newest ? newest->second : given;
}

namespace {

// One decoder graph compiled and expanded, reading its weights from a folder.
struct Compiled {
  Pcg pcg;
  TaskGraph tasks;
  ValueId tokens = 0, positions = 0, fetch = 0;
  std::int64_t length = 0;
};

// Returns each weight of `pcg` by name with its folder in `dir`, checking that the folder holds
// the weight's shape and dtype (in any layout). Every decoder graph has the same weights: their
// layouts are read once, here.
std::map<std::string, fs::path> weight_folders(const Pcg& pcg, const fs::path& dir,
                                               const std::string& given) {
  std::map<std::string, fs::path> folders;
  for (const Node& n : pcg.nodes) {
    if (n.kind != NodeKind::kWeight) continue;
    const fs::path folder = dir / n.name;
    if (!fs::exists(folder / "layout.json"))
      fail(ErrorKind::kInvalidArgument, "--weights {}: no tensor \"{}\" (no {})", given, n.name,
           (folder / "layout.json").string());
    const Layout held = read_layout(folder);
    if (held.shape != n.spec.shape || held.dtype != n.spec.dtype) {
      fail(ErrorKind::kShapeMismatch,
           "--weights {}: tensor \"{}\" is {}[{}] but the model says {}[{}]", given, n.name,
           to_string(held.dtype), fmt::join(held.shape, ", "), to_string(n.spec.dtype),
           fmt::join(n.spec.shape, ", "));
    }
    folders[n.name] = folder;
  }
  return folders;
}

// The compile options of every decoder graph.
CompileOptions decoder_compile_options(const ModelRunOptions& run) {
  return {.plan = run.plan, .decompose = {.shared_memory = run.backend == Backend::kThreads}};
}

// Returns `graph` compiled; the leader (device 0 under mpi, else the graph's lowest device)
// fetches the logits.
Compiled compile_decoder(DecoderGraph graph, const ModelRunOptions& run, DeviceId& leader) {
  Compiled c;
  c.length = graph.pcg.nodes[static_cast<std::size_t>(graph.tokens)].spec.shape[1];
  c.pcg =
      compile(graph.pcg, Mode::kRun,
              {.plan = run.plan, .decompose = {.shared_memory = run.backend == Backend::kThreads}});
  // Each cache is written in place by its attention (ops/attention.h): it must reach the kernel
  // as the value itself, never a moved copy.
  for (const Node& n : c.pcg.nodes) {
    if (n.kind != NodeKind::kCompute || n.op.type != OpType::kCachedAttention) continue;
    for (std::size_t k : {3u, 4u}) {
      const Node& cache = c.pcg.nodes[static_cast<std::size_t>(n.inputs[k])];
      MESHFLOW_CHECK(cache.kind == NodeKind::kInput, "the KV cache of \"{}\" would be moved",
                     n.name);
    }
  }
  c.tokens = find_value(c.pcg, c.pcg.nodes[static_cast<std::size_t>(graph.tokens)].name);
  c.positions = find_value(c.pcg, "positions:");
  const ValueId logits = c.pcg.outputs.front();
  leader = run.backend == Backend::kMpi ? DeviceId{0} : pcg_devices(c.pcg).front();
  c.fetch = add_fetch(c.pcg, logits, leader);
  c.tasks = expand_shards(c.pcg, {c.fetch}, run.plan);
  return c;
}

// What every device of the launch runs.
struct Session {
  const GenerateOptions* options = nullptr;
  const Compiled* first = nullptr;  // the prefill, or (no cache) the whole context
  const Compiled* step = nullptr;   // the one-token step (with the cache)
  DeviceId leader = 0;
  std::int64_t vocabulary = 0;
  const OnToken* on_token = nullptr;
  std::mutex mu;
  GenerateReport report;

  static const DeviceTasks* mine(const Compiled& c, DeviceId me) {
    for (const DeviceTasks& d : c.tasks.devices)
      if (d.device == me) return &d;
    return nullptr;
  }

  // Puts the global tokens [R, L] and the positions first .. first + L - 1 in place.
  static void set_inputs(const Compiled& c, DeviceId me, const std::vector<std::int64_t>& tokens,
                         std::int64_t rows, std::int64_t first, std::vector<Tensor>& values) {
    const Layout& tl = c.tasks.layouts[static_cast<std::size_t>(c.tokens)];
    if (find_device(tl.mesh, me)) {
      Tensor t(tl.dtype, {rows, c.length});
      visit_dtype(tl.dtype, [&](auto zero) {
        using T = decltype(zero);
        if constexpr (std::is_integral_v<T>) {
          auto d = t.data<T>();
          for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<T>(tokens[i]);
        }
      });
      values[static_cast<std::size_t>(c.tokens)] = slice(t, shard_box(tl, me));
    }
    const Layout& pl = c.tasks.layouts[static_cast<std::size_t>(c.positions)];
    if (find_device(pl.mesh, me)) {
      Tensor p(DType::kInt64, {c.length});
      auto d = p.data<std::int64_t>();
      for (std::int64_t j = 0; j < c.length; ++j) d[static_cast<std::size_t>(j)] = first + j;
      values[static_cast<std::size_t>(c.positions)] = slice(p, shard_box(pl, me));
    }
  }

  void run(Communicator& world) {
    const GenerateOptions& o = *options;
    const DeviceId me = world.device();
    const bool leader_here = me == leader;
    const auto rows = static_cast<std::int64_t>(o.num_samples);
    const auto prompt = static_cast<std::int64_t>(o.prompt.size());
    ThreadTeam team(o.run.threads_per_device > 0 ? o.run.threads_per_device
                                                 : default_threads_per_device(world.size()));
    const UseTeam use_team(&team);
    const DeviceTasks* first_tasks = mine(*first, me);
    std::vector<Tensor> values = first_tasks ? load_sources(first->pcg, *first_tasks)
                                             : std::vector<Tensor>(first->pcg.nodes.size());
    // The contexts, per sample, and what the leader chose.
    std::vector<std::vector<std::int64_t>> context(static_cast<std::size_t>(rows), o.prompt);
    std::vector<bool> done(static_cast<std::size_t>(rows), false);
    GenerateReport mine_report;
    mine_report.samples.resize(static_cast<std::size_t>(rows));
    const double start = steady_seconds();
    // Runs `c` over tokens of L positions from `first_position` on every device; the leader
    // chooses token i of every sample still going from the logits at row `row` of each
    // sample's run, and every device learns them (and whether every sample is done).
    auto run_and_choose = [&](const Compiled& c, const DeviceTasks* tasks,
                              std::vector<Tensor>& vals, const std::vector<std::int64_t>& tokens,
                              std::int64_t first_position, std::int64_t row, int i) {
      set_inputs(c, me, tokens, rows, first_position, vals);
      if (tasks) run_tasks(c.tasks, *tasks, world, vals, {.step = i + 1});
      std::vector<std::int64_t> message(static_cast<std::size_t>(rows) + 1, 0);
      if (leader_here) {
        const Tensor& logits = vals[static_cast<std::size_t>(c.fetch)];
        if (o.on_logits) o.on_logits(logits, first_position);
        const std::span<const float> all = logits.data<float>();
        bool finished = true;
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto ri = static_cast<std::size_t>(r);
          if (done[ri]) continue;
          const std::span<const float> at =
              all.subspan(static_cast<std::size_t>((r * c.length + row) * vocabulary),
                          static_cast<std::size_t>(vocabulary));
          const Choice ch = choose_token(at, o.sampling, i, r);
          message[ri] = ch.token;
          mine_report.samples[ri].tokens.push_back(ch.token);
          mine_report.samples[ri].logprobs.push_back(ch.logprob);
          if (*on_token && (*on_token)(static_cast<int>(r), ch.token)) done[ri] = true;
          if (i + 1 >= o.max_new_tokens) done[ri] = true;
          finished = finished && done[ri];
        }
        message.back() = finished ? 1 : 0;
      }
      broadcast(world, {.data = reinterpret_cast<std::byte*>(message.data()),
                        .count = rows + 1,
                        .dtype = DType::kInt64,
                        .root = rank_of(world, leader)});
      for (std::int64_t r = 0; r < rows; ++r)
        context[static_cast<std::size_t>(r)].push_back(message[static_cast<std::size_t>(r)]);
      return message.back() != 0;
    };
    auto flat = [&](std::int64_t from, std::int64_t length) {
      std::vector<std::int64_t> t;
      for (const auto& c : context)
        for (std::int64_t j = 0; j < length; ++j) {
          const auto at = static_cast<std::size_t>(from + j);
          t.push_back(at < c.size() ? c[at] : 0);  // past the context: padding, never read
        }
      return t;
    };
    bool finished = false;
    double first_done = 0;
    if (step) {
      finished = run_and_choose(*first, first_tasks, values, flat(0, prompt), 0, prompt - 1, 0);
      first_done = steady_seconds();
      // The step graph takes the weights and caches the prefill used.
      const DeviceTasks* step_tasks = mine(*step, me);
      std::vector<Tensor> step_values(step->pcg.nodes.size());
      if (step_tasks) {
        for (ValueId v : step_tasks->sources) {
          const Node& n = step->pcg.nodes[static_cast<std::size_t>(v)];
          if (n.source.kind == Source::Kind::kProvided) continue;  // the tokens, the positions
          Tensor& into = step_values[static_cast<std::size_t>(v)];
          auto it = first->pcg.names.find(n.name);
          if (it != first->pcg.names.end()) {
            Tensor& held = values[static_cast<std::size_t>(it->second)];
            if (held.shape() == local_shape(*n.layout, me)) {
              into = std::move(held);
              continue;
            }
          }
          into = load_shard(n, *n.layout, me);
        }
      }
      values.clear();
      for (int i = 1; i < o.max_new_tokens && !finished; ++i) {
        const std::int64_t at = prompt + i - 1;  // the position of the token fed
        finished = run_and_choose(*step, step_tasks, step_values, flat(at, 1), at, 0, i);
      }
    } else {
      for (int i = 0; i < o.max_new_tokens && !finished; ++i) {
        finished = run_and_choose(*first, first_tasks, values, flat(0, first->length), 0,
                                  prompt + i - 1, i);
        if (i == 0) first_done = steady_seconds();
      }
    }
    if (!leader_here) return;
    const double end = steady_seconds();
    mine_report.prefill_s = first_done - start;
    mine_report.decode_s = end - first_done;
    for (const GeneratedSample& s : mine_report.samples)
      mine_report.decoded +=
          std::max<std::int64_t>(0, static_cast<std::int64_t>(s.tokens.size()) - 1);
    mine_report.reporter = true;
    std::lock_guard lock(mu);
    report = std::move(mine_report);
  }
};

// Throws for options out of range and a prompt the model cannot take.
void check_options(const GenerateOptions& o, const DecoderGraph& g) {
  if (o.prompt.empty()) fail(ErrorKind::kInvalidArgument, "--prompt is empty");
  if (o.max_new_tokens < 1)
    fail(ErrorKind::kInvalidArgument, "--max-new-tokens {} must be >= 1", o.max_new_tokens);
  if (o.num_samples < 1)
    fail(ErrorKind::kInvalidArgument, "--num-samples {} must be >= 1", o.num_samples);
  check_sampling(o.sampling);
  if (o.tokenizer_vocabulary && *o.tokenizer_vocabulary > g.vocabulary) {
    fail(ErrorKind::kInvalidArgument,
         "--tokenizer: its vocabulary of {} ids is larger than the model's of {}",
         *o.tokenizer_vocabulary, g.vocabulary);
  }
  for (std::int64_t id : o.prompt)
    if (id < 0 || id >= g.vocabulary)
      fail(ErrorKind::kInvalidArgument, "--prompt: token {} is outside the vocabulary of {}", id,
           g.vocabulary);
  const auto total = static_cast<std::int64_t>(o.prompt.size()) + o.max_new_tokens;
  if (total > g.context) {
    fail(ErrorKind::kInvalidArgument,
         "--max-new-tokens {}: the prompt's {} tokens plus {} new ones exceed the model's context "
         "of {}",
         o.max_new_tokens, o.prompt.size(), o.max_new_tokens, g.context);
  }
}

}  // namespace

GenerateReport generate(const Model& model, const GenerateOptions& options,
                        const OnToken& on_token) {
  std::optional<Compiled> first, step;
  DeviceId leader = 0;
  std::int64_t vocabulary = 0;
  try {
    const GenerateNames names = generate_names(model);
    const auto rows = static_cast<std::int64_t>(std::max(1, options.num_samples));
    const auto prompt = static_cast<std::int64_t>(options.prompt.size());
    // Checked on a graph of one position first: the options' errors come before any other.
    DecoderGraph probe = decoder_graph(model, names, {.batch = rows, .length = 1});
    check_options(options, probe);
    vocabulary = probe.vocabulary;
    const std::map<std::string, fs::path> folders =
        weight_folders(probe.pcg, weights_folder(options.weights), options.weights.string());
    auto build = [&](DecoderShape shape, const std::map<std::string, CacheLayouts>& layouts) {
      DecoderGraph g = decoder_graph(model, names, shape, layouts);
      for (Node& n : g.pcg.nodes)
        if (n.kind == NodeKind::kWeight)
          n.source = Source{.kind = Source::Kind::kFolder, .path = folders.at(n.name)};
      return g;
    };
    if (options.cache) {
      // The caches hold what the prompt and every new token but the last put there.
      const std::int64_t capacity = prompt + options.max_new_tokens - 1;
      // Where the model puts each causal attention's k and v: the caches' layouts.
      DecoderGraph plain = build({.batch = rows, .length = prompt}, {});
      const Pcg laid_out = compile(plain.pcg, Mode::kRun, decoder_compile_options(options.run));
      const auto layouts = decoder_cache_layouts(laid_out, capacity);
      first =
          compile_decoder(build({.batch = rows, .length = prompt, .capacity = capacity}, layouts),
                          options.run, leader);
      step = compile_decoder(build({.batch = rows, .length = 1, .capacity = capacity}, layouts),
                             options.run, leader);
    } else {
      const std::int64_t length = prompt + options.max_new_tokens - 1;
      first = compile_decoder(build({.batch = rows, .length = length}, {}), options.run, leader);
    }
  } catch (const Error& e) {
    // Under mpi every rank prepared the same from the same input and failed alike: reported
    // once, by rank 0.
    if (options.run.backend != Backend::kMpi) throw;
    throw Error(e.kind(), e.what(), ErrorScope::kEveryDevice);
  }
  Session s{.options = &options,
            .first = &*first,
            .step = step ? &*step : nullptr,
            .leader = leader,
            .vocabulary = vocabulary,
            .on_token = &on_token};
  LaunchOptions lo{.backend = options.run.backend, .timeout = options.run.timeout};
  for (const DeviceTasks& d : first->tasks.devices) lo.devices.push_back(d.device);
  if (step)
    for (const DeviceTasks& d : step->tasks.devices)
      if (std::find(lo.devices.begin(), lo.devices.end(), d.device) == lo.devices.end())
        lo.devices.push_back(d.device);
  std::sort(lo.devices.begin(), lo.devices.end());
  lo.agreement = {{"the model", to_text(first->pcg)}};
  launch(lo, [&](Communicator& world) { s.run(world); });
  s.report.reporter = reports(options.run);
  return std::move(s.report);
}

}  // namespace meshflow
