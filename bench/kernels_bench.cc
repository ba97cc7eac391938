#include "bench/kernels_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "bench/collectives_bench.h"
#include "bench/floor.h"
#include "meshflow/core/error.h"
#include "meshflow/core/random.h"
#include "meshflow/kernels/float_mode.h"
#include "meshflow/kernels/gemm.h"
#include "meshflow/kernels/parallel.h"
#include "meshflow/ops/op.h"

namespace meshflow::bench {

namespace {

// The bench GPT's sizes (bench/gpt_model.h's GptConfig defaults).
constexpr std::int64_t kBatch = 8, kSeq = 256, kWidth = 512, kHeads = 8, kVocab = 8192;
constexpr std::int64_t kTokens = kBatch * kSeq, kHeadDim = kWidth / kHeads, kHidden = 4 * kWidth;

struct Product {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
};

// One case: what it runs, and what it is measured against.
struct Case {
  std::string name;
  std::string what;
  std::function<void()> run;
  // Memory-bound: the operands' bytes it reads, each once, and the bytes of its results, which
  // its floor moves (bench/floor.h).
  std::vector<FloorRead> reads;
  std::int64_t writes = 0;
  std::vector<Product> products;  // a product: the bare cblas_sgemm calls of its shapes
};

// Returns the operator's result on whole tensors, as the runtime calls its kernel.
Tensor call(const Op& op, const std::vector<const Tensor*>& in) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : in) specs.push_back(spec_of(*t));
  return run_kernel(normalize(op, specs), in, specs);
}

// Runs sibling operators on whole tensors in one pass, as a training step's task runs them
// (graph/task_graph.h's fused kernels), each reading the first of `in` it takes.
void call_together(const std::vector<Op>& ops, const std::vector<const Tensor*>& in) {
  std::vector<TensorSpec> specs;
  for (const Tensor* t : in) specs.push_back(spec_of(*t));
  std::vector<Op> normalized;
  for (const Op& op : ops)
    normalized.push_back(normalize(op, {specs.begin(), specs.begin() + arity(op.type).second}));
  run_kernels(normalized, in, specs);
}

Tensor random(const Shape& shape, std::uint64_t seed) {
  return random_tensor(DType::kFloat32, shape, seed);
}

Tensor ids(const Shape& shape, std::int64_t classes, std::uint64_t seed) {
  Tensor t(DType::kInt64, shape);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t& v : t.data<std::int64_t>()) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<std::int64_t>(x % static_cast<std::uint64_t>(classes));
  }
  return t;
}

// The operands every case reads, made once.
struct Operands {
  Tensor x = random({kTokens, kWidth}, 1), g_width = random({kTokens, kWidth}, 2);
  Tensor w_qkv = random({kWidth, kWidth}, 3), w_up = random({kWidth, kHidden}, 4);
  Tensor w_down = random({kHidden, kWidth}, 5), head = random({kWidth, kVocab}, 6);
  Tensor hidden = random({kTokens, kHidden}, 7), g_hidden = random({kTokens, kHidden}, 8);
  Tensor logits = random({kTokens, kVocab}, 9), g_logits = random({kTokens, kVocab}, 10);
  Tensor residual = random({kBatch, kSeq, kWidth}, 11), other = random({kBatch, kSeq, kWidth}, 12);
  Tensor ln_w = random({kWidth}, 13), ln_b = random({kWidth}, 14);
  Tensor labels = ids({kTokens}, kVocab, 15), tokens = ids({kBatch, kSeq}, kVocab, 16);
  Tensor table = random({kVocab, kWidth}, 17), g_embed = random({kBatch, kSeq, kWidth}, 18);
  Tensor heads = random({kBatch, kSeq, kHeads, kHeadDim}, 19);
  Tensor q = random({kBatch, kHeads, kSeq, kHeadDim}, 20);
  Tensor k = random({kBatch, kHeads, kSeq, kHeadDim}, 21);
  Tensor v = random({kBatch, kHeads, kSeq, kHeadDim}, 22);
  Tensor g_att = random({kBatch, kHeads, kSeq, kHeadDim}, 23);
  Tensor scalar = Tensor(DType::kFloat32, {});
  Tensor ln_stats;  // x's rows' statistics, as the forward pass keeps them for the gradients
  Operands();
};

Operands::Operands() {
  scalar.data<float>()[0] = 1.0f;
  ln_stats = call(Op{.type = OpType::kLayerNormStats}, {&x});
}

constexpr std::int64_t kF = 4;  // bytes per float

std::vector<Case> cases(const Operands& operands) {
  const Operands* d = &operands;  // the lambdas keep this pointer
  std::vector<Case> c;
  auto linear = [&c](const std::string& name, const Tensor* x, const Tensor* w, const Tensor* g) {
    const std::int64_t m = x->shape()[0], k = x->shape()[1], n = w->shape()[1];
    c.push_back({.name = name + "_fwd",
                 .what = fmt::format("x[{}, {}] @ w[{}, {}]", m, k, k, n),
                 .run =
                     [=] {
                       call(Op{.type = OpType::kLinear}, {x, w});
                     },
                 .products = {{false, false, m, n, k}}});
    c.push_back({.name = name + "_bwd",
                 .what = "g wᵀ and xᵀ g",
                 .run =
                     [=] {
                       call(Op{.type = OpType::kMatmulGradA}, {g, w});
                       call(Op{.type = OpType::kMatmulGradB}, {x, g});
                     },
                 .products = {{false, true, m, k, n}, {true, false, k, n, m}}});
  };
  linear("linear_qkv", &d->x, &d->w_qkv, &d->g_width);
  linear("linear_mlp_up", &d->x, &d->w_up, &d->g_hidden);
  linear("linear_mlp_down", &d->hidden, &d->w_down, &d->g_width);
  linear("matmul_logits", &d->x, &d->head, &d->g_logits);

  const auto hidden = static_cast<std::int64_t>(d->hidden.nbytes());
  const auto width = static_cast<std::int64_t>(d->x.nbytes());
  const auto logits = static_cast<std::int64_t>(d->logits.nbytes());
  c.push_back({.name = "gelu_fwd",
               .what = "[2048, 2048]",
               .run = [d] { call(Op{.type = OpType::kGelu}, {&d->hidden}); },
               .reads = {{&d->hidden}},
               .writes = hidden});
  c.push_back({.name = "gelu_bwd",
               .what = "g, x -> dx",
               .run =
                   [d] {
                     call(Op{.type = OpType::kGeluGrad}, {&d->g_hidden, &d->hidden});
                   },
               .reads = {{&d->g_hidden}, {&d->hidden}},
               .writes = hidden});
  c.push_back({.name = "add_fwd",
               .what = "the residual add, [8, 256, 512]",
               .run =
                   [d] {
                     call(Op{.type = OpType::kAdd}, {&d->residual, &d->other});
                   },
               .reads = {{&d->residual}, {&d->other}},
               .writes = width});
  c.push_back({.name = "add_bwd",
               .what = "the position embedding's gradient: [8, 256, 512] summed to [256, 512]",
               .run =
                   [d] {
                     call(Op{.type = OpType::kSumTo, .shape = {kSeq, kWidth}}, {&d->residual});
                   },
               .reads = {{&d->residual}},
               .writes = width / kBatch});
  // As a training step runs them: the forward pass keeps the rows' statistics (graph/
  // task_graph.h's fused kernels); dx alone (zero-bubble schedules run it apart), dw and db in
  // one pass over g and x, each reading the statistics.
  const auto stats = static_cast<std::int64_t>(d->ln_stats.nbytes());
  c.push_back({.name = "layer_norm_fwd",
               .what = "[2048, 512], keeping its statistics",
               .run =
                   [d] {
                     call_together(
                         {Op{.type = OpType::kLayerNorm}, Op{.type = OpType::kLayerNormStats}},
                         {&d->x, &d->ln_w, &d->ln_b});
                   },
               .reads = {{&d->x}, {&d->ln_w}, {&d->ln_b}},
               .writes = width + stats});
  c.push_back({.name = "layer_norm_bwd",
               .what = "dx (g, x, w, stats), then dw (g, x, stats) and db (g) in one pass",
               .run =
                   [d] {
                     call(Op{.type = OpType::kLayerNormGradX},
                          {&d->g_width, &d->x, &d->ln_w, &d->ln_stats});
                     call_together({Op{.type = OpType::kLayerNormGradW},
                                    Op{.type = OpType::kSumTo, .shape = {kWidth}}},
                                   {&d->g_width, &d->x, &d->ln_stats});
                   },
               .reads = {{&d->g_width},
                         {&d->x},
                         {&d->ln_w},
                         {&d->ln_stats},
                         {&d->g_width},
                         {&d->x},
                         {&d->ln_stats}},
               .writes = width + 2 * kWidth * kF});
  c.push_back({.name = "softmax_ce_fwd",
               .what = "logits [2048, 8192] and labels -> the mean loss",
               .run =
                   [d] {
                     call(Op{.type = OpType::kSoftmaxCrossEntropy}, {&d->logits, &d->labels});
                   },
               .reads = {{&d->logits}, {&d->labels}},
               .writes = kF});
  c.push_back({.name = "softmax_ce_bwd",
               .what = "the logits' gradient",
               .run =
                   [d] {
                     call(Op{.type = OpType::kSoftmaxCrossEntropyGrad},
                          {&d->logits, &d->labels, &d->scalar});
                   },
               .reads = {{&d->logits}, {&d->labels}, {&d->scalar}},
               .writes = logits});
  c.push_back({.name = "embedding_fwd",
               .what = "ids [8, 256] into table [8192, 512]",
               .run =
                   [d] {
                     call(Op{.type = OpType::kEmbedding}, {&d->tokens, &d->table});
                   },
               // A token's row of the table each (as many bytes as the result).
               .reads = {{&d->tokens}, {&d->table, width}},
               .writes = width});
  c.push_back({.name = "embedding_bwd",
               .what = "g's rows added into a zero [8192, 512] table",
               .run =
                   [d] {
                     call(Op{.type = OpType::kEmbeddingGrad, .shape = {kVocab, kWidth}},
                          {&d->tokens, &d->g_embed});
                   },
               .reads = {{&d->tokens}, {&d->g_embed}},
               .writes = static_cast<std::int64_t>(d->table.nbytes())});
  const Op to_heads{.type = OpType::kTranspose, .dims = {0, 2, 1, 3}};
  c.push_back({.name = "transpose_heads_fwd",
               .what = "[8, 256, 8, 64] -> [8, 8, 256, 64]",
               .run = [d, to_heads] { call(to_heads, {&d->heads}); },
               .reads = {{&d->heads}},
               .writes = width});
  c.push_back({.name = "transpose_heads_bwd",
               .what = "[8, 8, 256, 64] -> [8, 256, 8, 64]",
               .run = [d, to_heads] { call(to_heads, {&d->q}); },
               .reads = {{&d->q}},
               .writes = width});
  c.push_back({.name = "attention_fwd", .what = "causal, q, k, v [8, 8, 256, 64]", .run = [d] {
                 call(Op{.type = OpType::kAttention, .causal = true}, {&d->q, &d->k, &d->v});
               }});
  // The three gradients in one pass, as a training step runs them (graph/task_graph.h's fused).
  c.push_back({.name = "attention_bwd", .what = "dq, dk and dv in one pass", .run = [d] {
                 std::vector<Op> ops;
                 for (OpType t :
                      {OpType::kAttentionGradQ, OpType::kAttentionGradK, OpType::kAttentionGradV})
                   ops.push_back(Op{.type = t, .causal = true});
                 call_together(ops, {&d->q, &d->k, &d->v, &d->g_att});
               }});
  return c;
}

// PyTorch's same operators at the same shapes; prints {case: [seconds per rep]}.
std::string pytorch_script(int threads, int reps, int warmup, double warmup_s) {
  return fmt::format(
      R"(import json, math, sys, time, torch
torch.set_num_threads({threads}); torch.manual_seed(0)
F, aten = torch.nn.functional, torch.ops.aten
B, S, D, H, V, T = {b}, {s}, {d}, {h}, {v}, {b} * {s}
wanted = set(sys.argv[1:])
def r(*shape): return torch.randn(*shape)
res = {{}}
def case(name, f):
    if wanted and name not in wanted: return
    start, done = time.perf_counter(), 0
    while done < {warmup} or time.perf_counter() - start < {warmup_s}:
        f(); done += 1
    times = []
    for _ in range({reps}):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    res[name] = times
x, gw = r(T, D), r(T, D)
for name, a, w, g in (("linear_qkv", x, r(D, D), gw), ("linear_mlp_up", x, r(D, 4 * D), r(T, 4 * D)),
                      ("linear_mlp_down", r(T, 4 * D), r(4 * D, D), gw),
                      ("matmul_logits", x, r(D, V), r(T, V))):
    case(name + "_fwd", lambda a=a, w=w: a @ w)
    case(name + "_bwd", lambda a=a, w=w, g=g: (g @ w.t(), a.t() @ g))
h, gh = r(T, 4 * D), r(T, 4 * D)
case("gelu_fwd", lambda: F.gelu(h))
case("gelu_bwd", lambda: aten.gelu_backward(gh, h))
a, b = r(B, S, D), r(B, S, D)
case("add_fwd", lambda: a + b)
case("add_bwd", lambda: a.sum(0))
lw, lb = r(D), r(D)
case("layer_norm_fwd", lambda: F.layer_norm(x, (D,), lw, lb))
_, mean, rstd = aten.native_layer_norm(x, [D], lw, lb, 1e-5)
case("layer_norm_bwd", lambda: aten.native_layer_norm_backward(gw, x, [D], mean, rstd, lw, lb,
                                                               [True, True, True]))
logits, labels = r(T, V), torch.randint(0, V, (T,))
case("softmax_ce_fwd", lambda: F.cross_entropy(logits, labels))
lg = logits.clone().requires_grad_()
loss = F.cross_entropy(lg, labels)
case("softmax_ce_bwd", lambda: torch.autograd.grad(loss, lg, retain_graph=True))
ids, table, ge = torch.randint(0, V, (B, S)), r(V, D), r(B, S, D)
case("embedding_fwd", lambda: F.embedding(ids, table))
case("embedding_bwd", lambda: aten.embedding_dense_backward(ge, ids, V, -1, False))
hd, q = r(B, S, H, D // H), r(B, H, S, D // H)
case("transpose_heads_fwd", lambda: hd.transpose(1, 2).contiguous())
case("transpose_heads_bwd", lambda: q.transpose(1, 2).contiguous())
mask = torch.triu(torch.full((S, S), float("-inf")), 1)
def attention(q, k, v):
    return F.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H) + mask, dim=-1) @ v
qs = [r(B, H, S, D // H).requires_grad_() for _ in range(3)]
go = r(B, H, S, D // H)
case("attention_fwd", lambda: attention(*[t.detach() for t in qs]))
out = attention(*qs)
case("attention_bwd", lambda: torch.autograd.grad(out, qs, go, retain_graph=True))
print(json.dumps(res))
)",
      fmt::arg("threads", threads), fmt::arg("reps", reps), fmt::arg("warmup", warmup),
      fmt::arg("warmup_s", warmup_s), fmt::arg("b", kBatch), fmt::arg("s", kSeq),
      fmt::arg("d", kWidth), fmt::arg("h", kHeads), fmt::arg("v", kVocab));
}

// Returns PyTorch's times per case, or nothing when torch does not import.
std::map<std::string, std::vector<double>> pytorch_times(const KernelsBenchOptions& o,
                                                         int threads) {
  if (!o.pytorch) return {};
  std::vector<std::string> words{"/usr/bin/python3", "-c",
                                 pytorch_script(threads, o.reps, o.warmup, o.warmup_s)};
  words.insert(words.end(), o.cases.begin(), o.cases.end());
  const std::optional<nlohmann::json> j =
      run_command(words, {fmt::format("OMP_NUM_THREADS={}", threads)}).json();
  if (!j || !j->is_object()) return {};
  return j->get<std::map<std::string, std::vector<double>>>();
}

}  // namespace

BenchReport run_kernels_bench(const KernelsBenchOptions& o) {
  BenchReport report{.benchmark = "kernels", .progress = o.progress};
  report.memcpy_gbps = measured_memcpy_gbps();
  const int threads = o.threads > 0 ? o.threads : available_cores();
  const Operands d;
  std::vector<Case> all = cases(d);
  for (const std::string& name : o.cases) {
    if (std::none_of(all.begin(), all.end(), [&](const Case& c) { return c.name == name; }))
      fail(ErrorKind::kInvalidArgument, "bench kernels: no case \"{}\"", name);
  }
  std::erase_if(all, [&](const Case& c) {
    return !o.cases.empty() && std::find(o.cases.begin(), o.cases.end(), c.name) == o.cases.end();
  });
  const std::map<std::string, std::vector<double>> torch = pytorch_times(o, threads);
  // The baseline's buffers, large enough for every product.
  std::int64_t most_floats = 0;
  for (const Case& c : all) {
    for (const Product& p : c.products)
      most_floats = std::max({most_floats, p.m * p.k, p.k * p.n, p.m * p.n});
  }
  const Tensor a = random({std::max<std::int64_t>(1, most_floats)}, 33);
  const Tensor b = random({std::max<std::int64_t>(1, most_floats)}, 34);
  Tensor out = random({std::max<std::int64_t>(1, most_floats)}, 35);

  ThreadTeam team(threads);
  const UseTeam use(&team);
  const FlushDenormals flush;
  for (const Case& c : all) {
    BenchResult r{.case_name = c.name, .backend = "host", .devices = 1};
    std::function<void()> floor;
    std::optional<MemoryFloor> memory_floor;
    if (!c.products.empty()) {
      r.baseline = "cblas_sgemm";
      floor = [&] {
        for (const Product& p : c.products) {
          gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, a.data<float>().data(),
                      p.trans_a ? p.m : p.k, b.data<float>().data(), p.trans_b ? p.k : p.n, 0.0f,
                      out.data<float>().data(), p.n);
        }
      };
    } else if (!c.reads.empty()) {
      memory_floor.emplace(c.reads, c.writes);
      r.bytes = memory_floor->bytes();
      floor = [&] { memory_floor->run(); };
    }
    double warm = 0;
    for (int rep = 0; rep < o.warmup || warm < o.warmup_s; ++rep)
      warm += time_once(c.run) + (floor ? time_once(floor) : 0);
    for (int rep = 0; rep < o.reps; ++rep) {
      const double s = time_once(c.run);
      const double f = floor ? time_once(floor) : 0;
      r.case_s.push_back(s);
      if (!floor) continue;
      (c.products.empty() ? r.floor_s : r.baseline_s).push_back(f);
    }
    r.extra["op"] = c.what;
    r.extra["threads"] = threads;
    // The floor's own rate says what state the machine was in: on the reference machine the
    // same case's floor has run at rates up to 2x apart from one run to the next, and a
    // kernel's vs_floor differs between them. Compare runs of like floors.
    if (!r.floor_s.empty())
      r.extra["floor_gbps"] = static_cast<double>(r.bytes) / median(r.floor_s) / 1e9;
    const auto t = torch.find(c.name);
    if (t != torch.end() && !t->second.empty()) {
      r.extra["pytorch_s"] = median(t->second);
      r.extra["vs_pytorch"] = median(r.case_s) / median(t->second);
      if (c.name.starts_with("attention")) {
        r.baseline = "pytorch";
        r.baseline_s = t->second;
      }
    } else {
      r.extra["pytorch_s"] = nullptr;
      r.extra["vs_pytorch"] = nullptr;
    }
    r.extra["pytorch_threads"] = threads;
    add_result(report, std::move(r));
  }
  return report;
}

}  // namespace meshflow::bench
