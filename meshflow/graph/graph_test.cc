// The PCG as a value: the builder and the model file give the same graph, every bad input is
// one Error naming the node or tensor, the verifier rejects malformed graphs, parallel ops are
// checked by degrees, and seeded initialisers give the same tensor on any mesh.
#include <gtest/gtest.h>

#include <thread>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/graph/model_file.h"
#include "meshflow/graph/parallel_op.h"
#include "meshflow/graph/passes.h"
#include "meshflow/graph/source.h"
#include "meshflow/graph/testing.h"
#include "tests/error_of.h"

namespace meshflow {
namespace {

using testing::error_of;

constexpr std::string_view kDpTp = R"j({
  "meshes": {"m": "2x2"},
  "tensors": {
    "x":  {"shape": [8, 6], "input": {"normal": 1, "seed": 11}, "mesh": "m", "placements": ["S(0)", "R"]},
    "y":  {"shape": [8], "dtype": "int64", "input": "labels.npy", "mesh": "m", "placements": ["S(0)", "R"]},
    "w1": {"shape": [6, 8], "weight": {"normal": 0.3, "seed": 1}, "mesh": "m", "placements": ["R", "S(1)"]},
    "w2": {"shape": [8, 4], "weight": {"normal": 0.3, "seed": 2}, "mesh": "m", "placements": ["R", "S(0)"]},
    "b2": {"shape": [4], "weight": {"normal": 0.1, "seed": 3}, "mesh": "m", "placements": ["R", "R"]}
  },
  "nodes": [
    {"name": "h", "op": "linear", "inputs": ["x", "w1"]},
    {"name": "a", "op": "relu", "inputs": ["h"]},
    {"name": "o", "op": "linear", "inputs": ["a", "w2", "b2"]},
    {"name": "r", "op": "reduction", "inputs": ["o"], "degree": 2, "placements": ["S(0)", "R"]},
    {"name": "loss", "op": "softmax_cross_entropy", "inputs": ["r", "y"]}
  ],
  "loss": "loss",
  "outputs": ["r", "loss"]
})j";

// Parses a model whose data files are never opened (a test of structure, not data).
Model parse_structure(std::string_view text) { return parse_model(text, "/", "m.json"); }

std::vector<std::string> input_names(const Pcg& g, const Node& n) {
  std::vector<std::string> out;
  for (ValueId v : n.inputs) out.push_back(g.nodes[static_cast<std::size_t>(v)].name);
  return out;
}

TEST(ModelFile, BuildsTheSameGraphAsTheBuilder) {
  const std::string text(kDpTp);
  // The label file is not there: its check names the tensor.
  EXPECT_EQ(error_of([&] { parse_structure(text); }).substr(0, 31),
            "m.json: tensor \"y\": cannot open");
  const auto dir = std::filesystem::temp_directory_path() / "meshflow_graph_test";
  std::filesystem::create_directories(dir);
  Tensor labels(DType::kInt64, {8});
  for (std::int64_t i = 0; i < 8; ++i) labels.data<std::int64_t>()[i] = i % 4;
  write_npy(dir / "labels.npy", labels);
  const Model m = parse_model(text, dir, "m.json");
  const Pcg g = testing::dp_tp_mlp(dir / "labels.npy");
  // Node for node, by name (a JSON object gives its tensors in name order).
  ASSERT_EQ(m.pcg.nodes.size(), g.nodes.size());
  for (const Node& n : g.nodes) {
    Node f = m.pcg.nodes[static_cast<std::size_t>(find_value(m.pcg, n.name))];
    EXPECT_EQ(input_names(m.pcg, f), input_names(g, n)) << n.name;
    Node want = n;
    f.inputs.clear();
    want.inputs.clear();
    EXPECT_EQ(f, want) << n.name;
  }
  EXPECT_EQ(m.pcg.nodes[static_cast<std::size_t>(*m.pcg.loss)].name, "loss");
  ASSERT_EQ(m.pcg.outputs.size(), 2u);
  std::filesystem::remove_all(dir);
}

TEST(ModelFile, EveryBadFileIsOneErrorNamingTheCulprit) {
  struct Case {
    std::string text, message;
  };
  auto model = [](std::string tensors, std::string nodes, std::string extra = "") {
    return R"j({"meshes": {"m": "2", "one": "1"}, "tensors": {)j" + tensors + R"j(}, "nodes": [)j" +
           nodes + "]" + extra + "}";
  };
  const std::string x =
      R"j("x": {"shape": [4, 3], "weight": {"zeros": true}, "mesh": "m", "placements": ["S(0)"]})j";
  const std::vector<Case> cases = {
      {"{", "m.json: invalid JSON at byte 2"},
      {model(x, R"j({"name": "h", "op": "frobnicate", "inputs": ["x"]})j"),
       "m.json: node \"h\" has unknown op \"frobnicate\""},
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["nope"]})j"),
       "m.json: node \"h\" reads \"nope\", which is no tensor and no earlier node"},
      {model(x, R"j({"name": "x", "op": "relu", "inputs": ["x"]})j"),
       "m.json: name \"x\" is given to two values"},
      {model(
           R"j("x": {"shape": [4, 3], "weight": {"zeros": true}, "mesh": "mm", "placements": ["S(0)"]})j",
           ""),
       "m.json: \"tensors.x.mesh\" names mesh \"mm\", which \"meshes\" does not define (it has: m, "
       "one)"},
      {model(
           R"j("x": {"shape": [4, 3], "weight": {"zeros": true}, "mesh": "m", "placements": ["S(0)", "R"]})j",
           ""),
       "m.json: tensor \"x\": mesh 2 has 1 dims but placements \"S(0),R\" give 2: give one "
       "placement "
       "per mesh dim"},
      {model(x, R"j({"name": "h", "op": "matmul", "inputs": ["x", "x"]})j"),
       "m.json: node \"h\": "},
      {model(
           x,
           R"j({"name": "p", "op": "repartition", "inputs": ["x"], "dim": 1, "degree": 2, "placements": ["S(1)"]})j"),
       ""},  // builds; the degree is checked by layout inference (below)
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["x"]})j", R"j(, "loss": "h")j"),
       "m.json: the loss \"h\" is float32 4x3: a loss must be a floating-point scalar"},
      {model(x, R"j({"name": "a/b", "op": "relu", "inputs": ["x"]})j"),
       "m.json: name \"a/b\" cannot name a folder: use no '/', '.' or '..'"},
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["x"], "colour": 1})j"),
       "m.json: \"nodes[0]\" (a node) has unknown field \"colour\""},
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["x"], "approximate": "tanh"})j"),
       "m.json: \"nodes[0].approximate\" is gelu's (\"none\" or \"tanh\")"},
      {model(x, R"j({"name": "h", "op": "gelu", "inputs": ["x"], "approximate": "fast"})j"),
       "m.json: \"nodes[0].approximate\" must be \"none\" or \"tanh\""},
      {model(x, R"j({"name": "h", "op": "gelu", "inputs": ["x"], "approximate": "tanh"})j"), ""},
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["x"], "weight": "out_in"})j"),
       "m.json: \"nodes[0].weight\" is linear's (\"in_out\" or \"out_in\")"},
      {model(x, R"j({"name": "h", "op": "linear", "inputs": ["x", "x"], "weight": "oi"})j"),
       "m.json: \"nodes[0].weight\" must be \"in_out\" or \"out_in\""},
      {model(x, R"j({"name": "h", "op": "linear", "inputs": ["x", "x"], "weight": "out_in"})j"),
       ""},
      {model(x, R"j({"name": "h", "op": "slice", "inputs": ["x"], "dim": 1, "start": 1})j"),
       "m.json: missing field \"nodes[0].end\""},
      {model(x, R"j({"name": "h", "op": "relu", "inputs": ["x"], "start": 1})j"),
       "m.json: \"nodes[0].start\" is slice's"},
      {model(x,
             R"j({"name": "h", "op": "slice", "inputs": ["x"], "dim": -1, "start": 0, "end": 2})j"),
       ""},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { parse_structure(c.text); });
    if (c.message.empty()) {
      EXPECT_EQ(e, "(no error)") << c.text;
    } else {
      EXPECT_EQ(e.substr(0, c.message.size()), c.message) << c.text;
      EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    }
  }
}

// gelu {"approximate": "tanh"} is PyTorch's tanh form, and its backward's gradient is too.
TEST(ModelFile, GeluApproximateTanhReachesItsGradient) {
  const Model m = parse_structure(R"j({"meshes": {"m": "2"}, "tensors": {
    "x": {"shape": [4, 3], "input": {"normal": 1, "seed": 1}, "mesh": "m", "placements": ["S(0)"]},
    "w": {"shape": [3, 3], "weight": {"normal": 1, "seed": 2}, "mesh": "m", "placements": ["R"]}},
    "nodes": [{"name": "h", "op": "linear", "inputs": ["x", "w"]},
              {"name": "a", "op": "gelu", "inputs": ["h"], "approximate": "tanh"},
              {"name": "loss", "op": "mean", "inputs": ["a"], "dims": [0, 1]}],
    "loss": "loss"})j");
  EXPECT_TRUE(m.pcg.nodes[static_cast<std::size_t>(find_value(m.pcg, "a"))].op.approximate_tanh);
  const Pcg g = expand_backward(infer_layouts(m.pcg));
  int grads = 0;
  for (const Node& n : g.nodes) {
    if (n.kind == NodeKind::kCompute && n.op.type == OpType::kGeluGrad) {
      EXPECT_TRUE(n.op.approximate_tanh) << n.name;
      ++grads;
    }
  }
  EXPECT_EQ(grads, 1);
}

TEST(ParallelOp, DegreesThatDoNotFitNameTheNode) {
  Pcg g;
  const ValueId x = add_weight(g, "x", {{4, 3}}, parse_mesh("4"), parse_placements("R"), {});
  add_parallel(g, "p", ParallelOp{.type = ParallelType::kRepartition, .dim = 0, .degree = 2}, x,
               std::nullopt, parse_placements("S(0)"));
  EXPECT_EQ(error_of([&] { infer_layouts(g); }),
            "node \"p\": repartition degree 2 does not fit: it multiplies the shard degree of dim "
            "0 by 2, but mesh 4 placements R shape 4x3 float32 (shard [1,1] partial 1 replica 4) "
            "-> mesh 4 placements S(0) shape 4x3 float32 (shard [4,1] partial 1 replica 1)");
  Pcg ok;
  const ValueId y = add_weight(ok, "y", {{4, 3}}, parse_mesh("1"), parse_placements("R"), {});
  add_parallel(ok, "p", ParallelOp{.type = ParallelType::kReplicate, .degree = 2}, y,
               parse_mesh("2"), parse_placements("R"));
  EXPECT_NO_THROW(infer_layouts(ok));
}

TEST(ParallelOp, DegreesCountShardPartialAndReplica) {
  const Layout l = make_layout(parse_mesh("2x3x2"), parse_placements("S(1),P(sum),R"), {4, 4});
  EXPECT_EQ(degrees(l), (Degrees{.shard = {1, 2}, .partial = 3, .replica = 2}));
  EXPECT_EQ(gradient_placements(l), parse_placements("S(1),R,R"));
}

TEST(Verify, RejectsMalformedGraphs) {
  Pcg g = testing::pipeline();
  EXPECT_NO_THROW(verify(g, Stage::kBuilt));
  Pcg later = g;
  later.nodes[4].inputs = {5};  // h0 reads a later node
  EXPECT_NE(error_of([&] { verify(later, Stage::kBuilt); }).find("not an earlier node"),
            std::string::npos);
  Pcg spec = g;
  spec.nodes[4].spec.shape = {1, 1};
  EXPECT_NE(error_of([&] { verify(spec, Stage::kBuilt); }).find("spec differs"), std::string::npos);
  Pcg twice = g;
  twice.nodes[5].name = "h0";
  EXPECT_NE(error_of([&] { verify(twice, Stage::kBuilt); }).find("name \"h0\" twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { verify(g, Stage::kLaidOut); }).find("no layout"), std::string::npos);
  Pcg laid = infer_layouts(g);
  EXPECT_NO_THROW(verify(laid, Stage::kLaidOut));
  // o needs h on stage 1: until copy insertion h is on stage 0.
  EXPECT_NE(error_of([&] { verify(laid, Stage::kCopied); }).find("not in the needed layout"),
            std::string::npos);
  EXPECT_NO_THROW(verify(insert_copies(laid), Stage::kCopied));
}

TEST(Source, InitialisersGiveTheSameTensorOnAnyMesh) {
  for (Source::Kind kind : {Source::Kind::kNormal, Source::Kind::kUniform}) {
    Node n{.name = "w",
           .kind = NodeKind::kWeight,
           .spec = {{7, 5}},
           .source = Source{.kind = kind, .a = 0.5, .b = 2.0, .seed = 99}};
    const Tensor whole = load_global(n);
    const Layout l = make_layout(parse_mesh("2x2"), parse_placements("S(0),S(1)"), {7, 5});
    for (DeviceId d = 0; d < 4; ++d) {
      const Tensor shard = load_shard(n, l, d);
      const Tensor want = slice(whole, shard_box(l, d));
      EXPECT_EQ(std::vector<float>(shard.data<float>().begin(), shard.data<float>().end()),
                std::vector<float>(want.data<float>().begin(), want.data<float>().end()));
    }
    const auto v = whole.data<float>();
    EXPECT_NE(v[0], v[1]);
  }
  // Element 0 of uniform [0, 1) with seed 0 is (w0 >> 8) / 2^24 of Philox(ctr 0, key 0),
  // w0 = 0x6627e8d5 (Random123's known answer).
  Node u{
      .name = "u", .spec = {{1}}, .source = Source{.kind = Source::Kind::kUniform, .a = 0, .b = 1}};
  EXPECT_FLOAT_EQ(load_global(u).data<float>()[0],
                  static_cast<float>((0x6627e8d5u >> 8) / 16777216.0));
}

// Four devices load at once through one share: each gets what it would draw alone, in a
// buffer of its own; each shared box is drawn once; a box one device holds is not shared.
TEST(SourceShare, ReplicasDrawEachBoxOnceAndEachGetsItsOwnCopy) {
  auto weight = [](std::string name, Source::Kind kind, Shape shape, std::string mesh,
                   std::string placements) {
    Node n{.name = std::move(name),
           .kind = NodeKind::kWeight,
           .spec = {shape},
           .source = Source{.kind = kind, .a = 0.5, .b = 2.0, .seed = 7}};
    n.layout = make_layout(parse_mesh(mesh), parse_placements(placements), shape);
    return n;
  };
  Pcg pcg;
  pcg.nodes = {weight("r", Source::Kind::kNormal, {33, 17}, "4", "R"),        // 1 box, 4 hold
               weight("s", Source::Kind::kUniform, {6, 5}, "2x2", "S(0),R"),  // 2 boxes, 2 each
               weight("alone", Source::Kind::kNormal, {8, 3}, "4", "S(0)"),   // 4 boxes, 1 each
               weight("z", Source::Kind::kFill, {4}, "4", "R")};              // not drawn
  TaskGraph tasks;
  for (DeviceId d = 0; d < 4; ++d) tasks.devices.push_back({.device = d, .sources = {0, 1, 2, 3}});
  const std::vector<DeviceId> local{0, 1, 2, 3};
  for (int round = 0; round < 20; ++round) {
    SourceShare share(pcg, tasks, local);
    std::vector<std::vector<Tensor>> got(4);
    std::vector<std::thread> threads;
    for (DeviceId d = 0; d < 4; ++d)
      threads.emplace_back([&, d] { got[d] = load_sources(pcg, tasks.devices[d], &share); });
    for (auto& t : threads) t.join();
    EXPECT_EQ(share.drawn(), 1 + 2);
    for (DeviceId d = 0; d < 4; ++d) {
      const std::vector<Tensor> alone = load_sources(pcg, tasks.devices[d]);
      for (std::size_t v = 0; v < pcg.nodes.size(); ++v) {
        const std::span<const float> want = alone[v].data<float>();
        const std::span<const float> have = got[d][v].data<float>();
        ASSERT_EQ(std::vector<float>(have.begin(), have.end()),
                  std::vector<float>(want.begin(), want.end()))
            << pcg.nodes[v].name << " on device " << d;
        for (DeviceId other = 0; other < d; ++other)
          EXPECT_NE(got[other][v].data<float>().data(), have.data()) << pcg.nodes[v].name;
      }
    }
  }
}

// A draw that fails (an initialiser of int64) fails every replica with its error; none hangs.
TEST(SourceShare, AFailedDrawFailsEveryTakerOfItsBox) {
  Node n{.name = "ids",
         .kind = NodeKind::kWeight,
         .spec = {{5}, DType::kInt64},
         .source = Source::normal(1.0, 3)};
  n.layout = make_layout(parse_mesh("3"), parse_placements("R"), {5}, DType::kInt64);
  Pcg pcg;
  pcg.nodes = {n};
  TaskGraph tasks;
  for (DeviceId d = 0; d < 3; ++d) tasks.devices.push_back({.device = d, .sources = {0}});
  const std::vector<DeviceId> local{0, 1, 2};
  SourceShare share(pcg, tasks, local);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (DeviceId d = 0; d < 3; ++d)
    threads.emplace_back(
        [&, d] { errors[d] = error_of([&] { load_sources(pcg, tasks.devices[d], &share); }); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(share.drawn(), 1);
  for (const std::string& e : errors) EXPECT_NE(e.find("not int64"), std::string::npos) << e;
}

}  // namespace
}  // namespace meshflow
