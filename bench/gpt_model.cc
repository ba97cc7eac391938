#include "bench/gpt_model.h"

#include <fmt/format.h>

#include <optional>
#include <random>
#include <vector>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"

namespace meshflow::bench {

namespace {

// Builds the graph, seeding the weights 1, 2, ... in the order make_gpt.py does.
struct Builder {
  const GptConfig& c;
  bool sp;
  DeviceMesh mesh;
  Model m;
  std::uint64_t seed = 1;

  std::vector<Placement> P(const char* data_parallel, const char* sequence_parallel) const {
    return parse_placements(sp ? sequence_parallel : data_parallel);
  }

  ValueId weight(const std::string& name, Shape shape, const char* sp_placements, Source source) {
    source.seed = seed++;
    return add_weight(m.pcg, name, {std::move(shape)}, mesh, P("R", sp_placements), source);
  }
  ValueId normal(const std::string& name, Shape shape, const char* sp_placements, double std) {
    return weight(name, std::move(shape), sp_placements, Source::normal(std, 0));
  }

  ValueId compute(const std::string& name, Op op, std::vector<ValueId> inputs,
                  const char* sp_pin = nullptr) {
    std::optional<std::vector<Placement>> pin;
    if (sp && sp_pin) pin = parse_placements(sp_pin);
    return add_compute(m.pcg, name, std::move(op), std::move(inputs), std::nullopt, pin);
  }

  // A layer norm on the residual stream; under sequence parallelism its result is all-gathered
  // by a combine (Megatron's all-gather into the column-parallel products).
  ValueId layer_norm(const std::string& name, ValueId x) {
    const ValueId w = weight(name + "_w", {c.width}, "R",
                             Source{.kind = Source::Kind::kUniform, .a = 0.9, .b = 1.1});
    const ValueId b = normal(name + "_b", {c.width}, "R", 0.02);
    const ValueId n = compute(name, Op{.type = OpType::kLayerNorm}, {x, w, b}, "S(1)");
    if (!sp) return n;
    return add_parallel(
        m.pcg, name + "_all",
        ParallelOp{
            .type = ParallelType::kCombine, .dim = 1, .degree = static_cast<int>(size(mesh))},
        n, std::nullopt, parse_placements("R"));
  }
};

}  // namespace

void check_gpt_config(const GptConfig& c) {
  if (c.heads < 1 || c.width % c.heads != 0) {
    fail(ErrorKind::kInvalidArgument, "GPT width {} is not a multiple of its {} heads", c.width,
         c.heads);
  }
  if (c.blocks < 1) fail(ErrorKind::kInvalidArgument, "a GPT needs a block, not {}", c.blocks);
}

Model gpt_model(const GptConfig& c, GptLayout layout, const std::string& mesh_text,
                const std::filesystem::path& tokens, const std::filesystem::path& next) {
  check_gpt_config(c);
  Builder b{.c = c, .sp = layout == GptLayout::kSequenceParallel, .mesh = parse_mesh(mesh_text)};
  Pcg& g = b.m.pcg;
  const std::int64_t dh = c.width / c.heads, hidden = 4 * c.width;
  const ValueId ids = add_input(g, "tokens", {{c.batch, c.seq}, DType::kInt64}, b.mesh,
                                b.P("S(0)", "R"), {.kind = Source::Kind::kNpy, .path = tokens});
  const ValueId labels = add_input(g, "next", {{c.batch * c.seq}, DType::kInt64}, b.mesh,
                                   b.P("S(0)", "R"), {.kind = Source::Kind::kNpy, .path = next});
  const ValueId tok = b.normal("tok", {c.vocab, c.width}, "S(0)", 0.5);
  const ValueId pos = b.normal("pos", {c.seq, c.width}, "R", 0.1);
  const ValueId e = b.compute("e", Op{.type = OpType::kEmbedding}, {ids, tok});
  ValueId x = b.compute("x0", Op{.type = OpType::kAdd}, {e, pos}, "S(1)");
  const Op to_heads{.type = OpType::kTranspose, .dims = {0, 2, 1, 3}};
  for (int i = 0; i < c.blocks; ++i) {
    const std::string p = fmt::format("b{}", i);
    ValueId n = b.layer_norm(p + "_ln1", x);
    std::vector<ValueId> heads;
    for (const char* part : {"q", "k", "v"}) {
      const ValueId w = b.normal(fmt::format("{}_w{}", p, part), {c.width, c.width}, "S(1)", 0.3);
      const ValueId y =
          b.compute(fmt::format("{}_{}", p, part), Op{.type = OpType::kLinear}, {n, w}, "S(2)");
      const ValueId y4 =
          b.compute(fmt::format("{}_{}4", p, part),
                    Op{.type = OpType::kReshape, .shape = {-1, c.seq, c.heads, dh}}, {y});
      heads.push_back(b.compute(fmt::format("{}_{}h", p, part), to_heads, {y4}));
    }
    const ValueId att =
        b.compute(p + "_att", Op{.type = OpType::kAttention, .causal = true}, heads);
    const ValueId at = b.compute(p + "_at", to_heads, {att});
    const ValueId a =
        b.compute(p + "_a", Op{.type = OpType::kReshape, .shape = {-1, c.seq, c.width}}, {at});
    const ValueId wo = b.normal(p + "_wo", {c.width, c.width}, "S(0)", 0.3);
    const ValueId o = b.compute(p + "_o", Op{.type = OpType::kLinear}, {a, wo});
    x = b.compute(p + "_x1", Op{.type = OpType::kAdd}, {x, o}, "S(1)");
    n = b.layer_norm(p + "_ln2", x);
    const ValueId w1 = b.normal(p + "_w1", {c.width, hidden}, "S(1)", 0.2);
    const ValueId w2 = b.normal(p + "_w2", {hidden, c.width}, "S(0)", 0.1);
    const ValueId h = b.compute(p + "_h", Op{.type = OpType::kLinear}, {n, w1}, "S(2)");
    const ValueId gl = b.compute(p + "_g", Op{.type = OpType::kGelu}, {h});
    const ValueId mlp = b.compute(p + "_m", Op{.type = OpType::kLinear}, {gl, w2});
    x = b.compute(p + "_x2", Op{.type = OpType::kAdd}, {x, mlp}, "S(1)");
  }
  const ValueId n = b.layer_norm("lnf", x);
  const ValueId head = b.normal("head", {c.width, c.vocab}, "S(1)", 0.3);
  const ValueId logits = b.compute("logits", Op{.type = OpType::kLinear}, {n, head}, "S(2)");
  const ValueId flat = b.compute(
      "flat", Op{.type = OpType::kReshape, .shape = {-1, c.vocab}}, {logits});
  set_loss(g, b.compute("loss", Op{.type = OpType::kSoftmaxCrossEntropy}, {flat, labels}));
  return std::move(b.m);
}

void write_gpt_tokens(const GptConfig& c, const std::filesystem::path& tokens,
                      const std::filesystem::path& next) {
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<std::int64_t> id(0, c.vocab - 1);
  Tensor t(DType::kInt64, {c.batch, c.seq}), n(DType::kInt64, {c.batch * c.seq});
  for (std::int64_t i = 0; i < c.batch * c.seq; ++i) {
    t.data<std::int64_t>()[i] = id(rng);
    n.data<std::int64_t>()[i] = id(rng);
  }
  write_npy(tokens, t);
  write_npy(next, n);
}

}  // namespace meshflow::bench
