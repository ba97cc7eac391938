#include "meshflow/infer/decoder_graph.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "meshflow/core/error.h"
#include "meshflow/core/npy.h"
#include "meshflow/core/random.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

const fs::path kGpt = fs::path(MESHFLOW_EXAMPLES_DIR) / "models" / "gpt";

Model gpt(const std::string& layout) {
  Model m = load_model(kGpt / ("gpt_" + layout + ".json"));
  m.generate = {{"tokens", "tokens"}, {"logits", "logits"}};
  return m;
}

const Node& named(const Pcg& pcg, const std::string& name) {
  return pcg.nodes[static_cast<std::size_t>(find_value(pcg, name))];
}

TEST(DecoderGraph, ResizesTheBatchAndPositionsAndReadsThePositionTableAtThePositions) {
  const Model m = gpt("tp");
  const GenerateNames names = generate_names(m);
  const DecoderGraph g = decoder_graph(m, names, {.batch = 3, .length = 2});
  EXPECT_EQ(g.context, 8);
  EXPECT_EQ(g.vocabulary, 32);
  EXPECT_EQ(named(g.pcg, "tokens").spec.shape, (Shape{3, 2}));
  EXPECT_EQ(named(g.pcg, "b0_q4").op.shape, (Shape{-1, 2, 4, 4}));  // the model's 8 -> 2
  EXPECT_EQ(named(g.pcg, "b1_a").spec.shape, (Shape{3, 2, 16}));
  EXPECT_EQ(named(g.pcg, "logits").spec.shape, (Shape{3, 2, 32}));
  // x0 = e + pos reads pos [8, 16] at the run's positions.
  const Node& x0 = named(g.pcg, "x0");
  EXPECT_EQ(g.pcg.nodes[static_cast<std::size_t>(x0.inputs[1])].name, "positions:pos");
  EXPECT_EQ(named(g.pcg, "positions:pos").op.type, OpType::kEmbedding);
  // Nothing the logits do not need: no targets, no loss.
  EXPECT_FALSE(g.pcg.names.count("loss"));
  EXPECT_FALSE(g.pcg.names.count("next"));
  EXPECT_TRUE(g.caches.empty());
}

TEST(DecoderGraph, CachedAttentionReadsCachesInTheLayoutsGiven) {
  const Model m = gpt("tp");
  const GenerateNames names = generate_names(m);
  const Layout cache =
      make_layout(make_mesh({4}, {0, 1, 2, 3}), {Placement::shard(1)}, {1, 4, 6, 4});
  const DecoderGraph g = decoder_graph(m, names, {.batch = 1, .length = 1, .capacity = 6},
                                       {{"b0_att", {cache, cache}}, {"b1_att", {cache, cache}}});
  ASSERT_EQ(g.caches.size(), 2u);
  const Node& att = named(g.pcg, "b1_att");
  EXPECT_EQ(att.op.type, OpType::kCachedAttention);
  EXPECT_EQ(att.spec.shape, (Shape{1, 4, 1, 4}));
  const Node& k = named(g.pcg, "cache_k:b1_att");
  EXPECT_EQ(k.spec.shape, (Shape{1, 4, 6, 4}));
  EXPECT_EQ(*k.placements, std::vector<Placement>{Placement::shard(1)});
  EXPECT_EQ(k.source.kind, Source::Kind::kZeros);
}

// A model over tokens [2, 4] of a vocabulary of 8 whose logits come through `nodes` from "h"
// ([2, 4, 8], the embedding of the tokens).
Model tiny(const std::string& nodes, const std::string& logits = "logits") {
  const fs::path dir =
      fs::temp_directory_path() / ("meshflow_decoder_graph_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Tensor t(DType::kInt64, {2, 4});
  for (std::int64_t i = 0; i < 8; ++i) t.data<std::int64_t>()[static_cast<std::size_t>(i)] = i % 8;
  write_npy(dir / "tokens.npy", t);
  const std::string text = R"({
    "meshes": {"m": "1"},
    "tensors": {
      "tokens": {"shape": [2, 4], "dtype": "int64", "input": "tokens.npy", "mesh": "m", "placements": ["R"]},
      "table": {"shape": [8, 8], "weight": {"normal": 1, "seed": 1}, "mesh": "m", "placements": ["R"]},
      "wide": {"shape": [4, 8], "weight": {"normal": 1, "seed": 2}, "mesh": "m", "placements": ["R"]}
    },
    "nodes": [{"name": "h", "op": "embedding", "inputs": ["tokens", "table"]})" +
                           nodes + R"(],
    "outputs": [")" + logits +
                           R"("],
    "generate": {"tokens": "tokens", "logits": ")" +
                           logits + R"("}
  })";
  Model m = parse_model(text, dir, "tiny.json");
  fs::remove_all(dir);  // read while parsing; the decoder graph reads no file
  return m;
}

std::string refusal(const Model& m) {
  try {
    decoder_graph(m, generate_names(m), {.batch = 1, .length = 1});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DecoderGraph, RefusesANodeThatMixesPositionsNamingIt) {
  EXPECT_NE(refusal(tiny(R"(, {"name": "s", "op": "sum", "inputs": ["h"], "dims": [1]},
                             {"name": "s3", "op": "reshape", "inputs": ["s"], "shape": [2, 1, 8]},
                             {"name": "logits", "op": "add", "inputs": ["h", "s3"]})"))
                .find("node \"s\" sums over the positions"),
            std::string::npos);
  EXPECT_NE(refusal(tiny(R"(, {"name": "logits", "op": "softmax", "inputs": ["h"], "dim": 1})"))
                .find("node \"logits\" normalises along the positions"),
            std::string::npos);
  EXPECT_NE(
      refusal(tiny(R"(, {"name": "h4", "op": "reshape", "inputs": ["h"], "shape": [2, 1, 4, 8]},
                             {"name": "a", "op": "attention", "inputs": ["h4", "h4", "h4"]},
                             {"name": "logits", "op": "reshape", "inputs": ["a"], "shape": [2, 4, 8]})"))
          .find("node \"a\" attends without the causal mask"),
      std::string::npos);
  EXPECT_NE(refusal(tiny(R"(, {"name": "flat", "op": "reshape", "inputs": ["h"], "shape": [2, 32]},
                             {"name": "logits", "op": "reshape", "inputs": ["flat"], "shape": [2, 4, 8]})"))
                .find("node \"flat\" merges the positions with another dim"),
            std::string::npos);
  // A weight [S, D] added along the positions is read at them.
  EXPECT_EQ(refusal(tiny(R"(, {"name": "logits", "op": "add", "inputs": ["h", "wide"]})")), "");
}

TEST(DecoderGraph, NamesAMissingOrWrongGenerateObject) {
  Model m = gpt("one");
  m.generate = nullptr;
  EXPECT_THROW(generate_names(m), Error);
  m.generate = {{"tokens", "tok"}, {"logits", "logits"}};
  try {
    generate_names(m);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "\"tokens\" is \"tok\", which is not an int32 or int64 [B, S] input"),
              std::string::npos)
        << e.what();
  }
  m.generate = {{"tokens", "tokens"}, {"logits", "b1_ln1_w"}};
  EXPECT_THROW(generate_names(m), Error);
}

}  // namespace
}  // namespace meshflow
