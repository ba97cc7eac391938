#include "bench/generate_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "bench/collectives_bench.h"
#include "bench/floor.h"
#include "meshflow/core/error.h"
#include "meshflow/graph/compile.h"
#include "meshflow/graph/source.h"
#include "meshflow/infer/decoder_graph.h"
#include "meshflow/infer/generate.h"
#include "meshflow/mesh/sharded_folder.h"

namespace meshflow::bench {

namespace {

namespace fs = std::filesystem;

// Writes `model`'s initial weights into `dir` as --save folders, each whole on one device.
void write_weights(const Model& model, const fs::path& dir) {
  for (const Node& n : model.pcg.nodes) {
    if (n.kind != NodeKind::kWeight) continue;
    std::vector<Tensor> shards;
    shards.push_back(load_global(n));
    write_sharded(
        dir / n.name,
        make_layout(make_mesh({1}, {0}), {Placement::replicate()}, n.spec.shape, n.spec.dtype),
        shards);
  }
}

// The cache layouts and the compiled decoder graph of `shape`, as generate builds them.
Pcg compiled_decoder(const Model& m, const DecoderShape& shape) {
  const GenerateNames names = generate_names(m);
  DecoderShape plain = shape;
  plain.capacity = 0;
  const auto layouts = decoder_cache_layouts(
      compile(decoder_graph(m, names, plain).pcg, Mode::kRun), shape.capacity);
  return compile(decoder_graph(m, names, shape, layouts).pcg, Mode::kRun);
}

// The bytes one decoding step of `rows` samples reads on its busiest device: every weight's
// shard, but an embedding table's one row per sample, and the KV caches at `mean_length`
// positions.
std::int64_t step_bytes(const Pcg& g, std::int64_t rows, std::int64_t mean_length) {
  std::vector<bool> table(g.nodes.size(), false);
  for (const Node& n : g.nodes)
    if (n.kind == NodeKind::kCompute && n.op.type == OpType::kEmbedding)
      table[static_cast<std::size_t>(n.inputs[1])] = true;
  std::map<DeviceId, std::int64_t> bytes;
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& n = g.nodes[v];
    const bool cache = n.name.starts_with("cache_");
    if (n.kind != NodeKind::kWeight && !cache) continue;
    const Layout& l = *n.layout;
    for (DeviceId d : l.mesh.devices) {
      const Shape s = local_shape(l, d);
      std::int64_t count = numel(s);
      if (table[v])
        count = s.empty() ? 0 : std::min(count, rows * (count / std::max<std::int64_t>(1, s[0])));
      if (cache) count = count / std::max<std::int64_t>(1, s[s.size() - 2]) * mean_length;
      bytes[d] += count * static_cast<std::int64_t>(size_of(l.dtype));
    }
  }
  std::int64_t most = 0;
  for (const auto& [d, b] : bytes) most = std::max(most, b);
  return most;
}

// A KV-cached eager PyTorch decoding loop of the bench GPT's shape: returns the seconds per
// decoding step of each timed rep, or nothing when torch does not import.
std::vector<double> pytorch_decode(const GenerateBenchOptions& o, std::int64_t rows, int threads) {
  const GptConfig& c = o.gpt;
  const std::string script = fmt::format(
      "import json, math, time, torch\n"
      "torch.set_num_threads({threads}); torch.manual_seed(0)\n"
      "F = torch.nn.functional\n"
      "R, P, N, D, H, V, L, S = {r}, {p}, {n}, {d}, {h}, {v}, {l}, {s}\n"
      "dh = D // H\n"
      "def w(*s): return torch.randn(*s) * 0.02\n"
      "tok, pos = w(V, D), w(S, D)\n"
      "blocks = [dict(ln1=torch.nn.LayerNorm(D), ln2=torch.nn.LayerNorm(D), q=w(D, D), k=w(D, D),\n"
      "               v=w(D, D), o=w(D, D), w1=w(D, 4 * D), w2=w(4 * D, D)) for _ in range(L)]\n"
      "lnf, head = torch.nn.LayerNorm(D), w(D, V)\n"
      "kc = [torch.zeros(R, H, P + N, dh) for _ in range(L)]\n"
      "vc = [torch.zeros(R, H, P + N, dh) for _ in range(L)]\n"
      "def forward(ids, p0):\n"
      "    T = ids.shape[1]\n"
      "    x = tok[ids] + pos[p0:p0 + T]\n"
      "    for i, b in enumerate(blocks):\n"
      "        n = b['ln1'](x)\n"
      "        q, k, v = [(n @ b[m]).view(R, T, H, dh).transpose(1, 2) for m in 'qkv']\n"
      "        kc[i][:, :, p0:p0 + T] = k; vc[i][:, :, p0:p0 + T] = v\n"
      "        s = q @ kc[i][:, :, :p0 + T].transpose(-1, -2) / math.sqrt(dh)\n"
      "        if T > 1: s = s + torch.triu(torch.full((T, p0 + T), float('-inf')), p0 + 1)\n"
      "        a = F.softmax(s, dim=-1) @ vc[i][:, :, :p0 + T]\n"
      "        x = x + a.transpose(1, 2).reshape(R, T, D) @ b['o']\n"
      "        x = x + F.gelu(b['ln2'](x) @ b['w1']) @ b['w2']\n"
      "    return lnf(x[:, -1]) @ head\n"
      "times = []\n"
      "with torch.no_grad():\n"
      "    for rep in range({total}):\n"
      "        nxt = forward(torch.randint(0, V, (R, P)), 0).argmax(-1, keepdim=True)\n"
      "        t = time.perf_counter()\n"
      "        for i in range(1, N):\n"
      "            nxt = forward(nxt, P + i - 1).argmax(-1, keepdim=True)\n"
      "        times.append((time.perf_counter() - t) / (N - 1))\n"
      "print(json.dumps(times[{warmup}:]))\n",
      fmt::arg("threads", threads), fmt::arg("r", rows), fmt::arg("p", o.prompt),
      fmt::arg("n", o.new_tokens), fmt::arg("d", c.width), fmt::arg("h", c.heads),
      fmt::arg("v", c.vocab), fmt::arg("l", c.blocks), fmt::arg("s", c.seq),
      fmt::arg("total", o.reps + o.warmup), fmt::arg("warmup", o.warmup));
  const std::optional<nlohmann::json> j =
      run_command({"/usr/bin/python3", "-c", script}, {fmt::format("OMP_NUM_THREADS={}", threads)})
          .json();
  if (!j || !j->is_array()) return {};
  return j->get<std::vector<double>>();
}

bool wanted(const GenerateBenchOptions& o, std::string_view name) {
  return o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), name) != o.cases.end();
}

std::vector<std::int64_t> prompt_of(std::int64_t length, std::int64_t vocab) {
  std::vector<std::int64_t> p;
  for (std::int64_t i = 0; i < length; ++i) p.push_back((i * 7919 + 13) % vocab);
  return p;
}

}  // namespace

BenchReport run_generate_bench(const GenerateBenchOptions& o) {
  check_gpt_config(o.gpt);
  BenchReport report{.benchmark = "generate", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const TempFolder weights("meshflow_generate_bench");
  bool written = false;
  for (const std::string& mesh : o.meshes) {
    const int devices = static_cast<int>(size(parse_mesh(mesh)));
    const GptFiles files(o.gpt, devices);
    Model m = files.load(devices == 1 ? "one" : "tp");
    m.generate = {{"tokens", "tokens"}, {"logits", "logits"}};
    if (!written) {
      write_weights(m, weights.path());
      written = true;
    }
    const int threads =
        o.threads_per_device > 0 ? o.threads_per_device : default_threads_per_device(devices);
    auto options = [&](std::int64_t rows, std::int64_t prompt, int tokens, bool cache) {
      GenerateOptions g{.weights = weights.path(),
                        .prompt = prompt_of(prompt, o.gpt.vocab),
                        .max_new_tokens = tokens,
                        .num_samples = static_cast<int>(rows),
                        .sampling = {.temperature = 0},
                        .cache = cache};
      g.run.threads_per_device = threads;
      return g;
    };
    const std::string model_text = fmt::format(
        "GPT: {} blocks, width {}, {} heads, context {}, vocabulary {}, float32, {}", o.gpt.blocks,
        o.gpt.width, o.gpt.heads, o.gpt.seq, o.gpt.vocab, devices == 1 ? "one device" : "tp");
    for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{8}}) {
      const std::string name = rows == 1 ? "decode" : "decode_batch8";
      if (!wanted(o, name)) continue;
      const std::int64_t mean = o.prompt + o.new_tokens / 2;
      const std::int64_t bytes =
          step_bytes(compiled_decoder(
                         m, {.batch = rows, .length = 1, .capacity = o.prompt + o.new_tokens - 1}),
                     rows, mean);
      std::vector<std::byte> from(static_cast<std::size_t>(bytes)), to(from.size());
      BenchResult r{.case_name = name,
                    .backend = "threads",
                    .mesh = mesh,
                    .devices = devices,
                    .bytes = bytes};
      for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
        const GenerateReport g = generate(m, options(rows, o.prompt, o.new_tokens, true));
        const double floor = time_once([&] { std::memcpy(to.data(), from.data(), from.size()); });
        if (rep < o.warmup) continue;
        r.case_s.push_back(g.decode_s / (o.new_tokens - 1));
        r.floor_s.push_back(floor);
      }
      if (o.pytorch) {
        std::vector<double> torch = pytorch_decode(o, rows, threads * devices);
        if (!torch.empty()) {
          r.baseline = "pytorch";
          r.baseline_s = std::move(torch);
          r.extra["pytorch_threads"] = threads * devices;
        }
      }
      r.extra["tokens_per_s"] = static_cast<double>(rows) / median(r.case_s);
      r.extra["threads_per_device"] = threads;
      r.extra["prompt"] = o.prompt;
      r.extra["new_tokens"] = o.new_tokens;
      r.extra["model"] = model_text;
      add_result(report, std::move(r));
    }
    if (wanted(o, "no_cache")) {
      BenchResult r{
          .case_name = "no_cache", .backend = "threads", .mesh = mesh, .devices = devices};
      for (int rep = 0; rep < o.warmup + std::max(1, o.reps / 3); ++rep) {
        const GenerateReport g = generate(m, options(1, o.prompt, o.new_tokens, false));
        if (rep < o.warmup) continue;
        r.case_s.push_back(g.decode_s / (o.new_tokens - 1));
      }
      for (const BenchResult& d : report.results)
        if (d.case_name == "decode" && d.mesh == mesh)
          r.extra["vs_cached"] = median(r.case_s) / median(d.case_s);
      r.extra["model"] = model_text;
      add_result(report, std::move(r));
    }
    if (wanted(o, "prefill")) {
      const std::int64_t rows = o.prefill_samples, length = o.prefill_tokens;
      ProductFloor products(
          expand_shards(compiled_decoder(m, {.batch = rows, .length = length, .capacity = length}),
                        {}),
          1, threads);
      BenchResult r{.case_name = "prefill",
                    .backend = "threads",
                    .mesh = mesh,
                    .devices = devices,
                    .bytes = rows * length * o.gpt.width * 4};
      for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
        const GenerateReport g = generate(m, options(rows, length, 1, true));
        const double floor = products.time();
        if (rep < o.warmup) continue;
        r.case_s.push_back(g.prefill_s);
        r.floor_s.push_back(floor);
      }
      r.extra["floor_products"] = products.products();
      r.extra["prompt"] = length;
      r.extra["samples"] = rows;
      r.extra["model"] = model_text;
      add_result(report, std::move(r));
    }
  }
  return report;
}

}  // namespace meshflow::bench
