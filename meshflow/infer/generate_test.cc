#include "meshflow/infer/generate.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "meshflow/core/error.h"
#include "meshflow/graph/reference.h"
#include "meshflow/graph/source.h"
#include "meshflow/mesh/sharded_folder.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

const fs::path kGpt = fs::path(MESHFLOW_EXAMPLES_DIR) / "models" / "gpt";

// The GPT example of `layout` (vocabulary 32, context 8, 2 blocks), with its "generate" object.
Model gpt(const std::string& layout) {
  Model m = load_model(kGpt / ("gpt_" + layout + ".json"));
  m.generate = {{"tokens", "tokens"}, {"logits", "logits"}};
  return m;
}

// A --save folder of `model`'s initial weights, each whole on device 0 (any layout is read),
// removed with this object.
struct SavedWeights {
  fs::path dir;
  ~SavedWeights() { fs::remove_all(dir); }
};

SavedWeights saved_weights(const Model& model) {
  // One folder per test and process: ctest runs the tests at once.
  const fs::path dir =
      fs::temp_directory_path() /
      fmt::format("meshflow_generate_test_{}_{}",
                  ::testing::UnitTest::GetInstance()->current_test_info()->name(), ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const Node& n : model.pcg.nodes) {
    if (n.kind != NodeKind::kWeight) continue;
    const Layout l =
        make_layout(make_mesh({1}, {0}), {Placement::replicate()}, n.spec.shape, n.spec.dtype);
    std::vector<Tensor> shards;
    shards.push_back(load_global(n));
    write_sharded(dir / n.name, l, shards);
  }
  return {dir};
}

// The layouts of one model (the first is its one-device layout), and the pipelined models (of
// more blocks, each its own).
const std::vector<std::vector<std::string>> kFamilies = {
    {"one", "dp", "tp", "tp_vocab", "sp", "dp_tp"}, {"pp"}, {"pp_dp_tp"}};

GenerateReport run(const std::string& layout, GenerateOptions o, const std::string& weights_of) {
  const Model m = gpt(layout);
  const SavedWeights weights = saved_weights(gpt(weights_of));
  o.weights = weights.dir;
  o.run.threads_per_device = 1;
  return generate(m, o);
}

TEST(Generate, GreedyWithTheCacheEqualsTheWholeContextOnEveryLayout) {
  const GenerateOptions base{
      .prompt = {3, 17, 4}, .max_new_tokens = 5, .num_samples = 2, .sampling = {.temperature = 0}};
  for (const auto& family : kFamilies) {
    GenerateOptions plain = base;
    plain.cache = false;
    const GenerateReport reference = run(family.front(), plain, family.front());
    ASSERT_EQ(reference.samples.size(), 2u);
    ASSERT_EQ(reference.samples[0].tokens.size(), 5u);
    for (const std::string& layout : family) {
      for (bool cache : {true, false}) {
        GenerateOptions o = base;
        o.cache = cache;
        const GenerateReport r = run(layout, o, family.front());
        for (std::size_t s = 0; s < 2; ++s) {
          EXPECT_EQ(r.samples[s].tokens, reference.samples[s].tokens) << layout << " " << cache;
          for (std::size_t i = 0; i < 5; ++i)
            EXPECT_NEAR(r.samples[s].logprobs[i], reference.samples[s].logprobs[i], 1e-4)
                << layout << " " << cache << " token " << i;
        }
      }
    }
  }
}

TEST(Generate, SeededSamplingGivesTheSameTokensOnEveryLayout) {
  // The model and seeds draw no u within rounding of a cumulative probability (checked: the
  // logprobs agree to 1e-4 on every layout, and the tokens are equal).
  const GenerateOptions o{.prompt = {5},
                          .max_new_tokens = 7,
                          .num_samples = 3,
                          .sampling = {.temperature = 1, .seed = 42}};
  for (const auto& family : kFamilies) {
    const GenerateReport reference = run(family.front(), o, family.front());
    bool differ = false;
    for (std::size_t s = 1; s < 3; ++s)
      differ = differ || reference.samples[s].tokens != reference.samples[0].tokens;
    EXPECT_TRUE(differ);  // the samples of one batch draw apart
    for (const std::string& layout : family) {
      const GenerateReport r = run(layout, o, family.front());
      for (std::size_t s = 0; s < 3; ++s)
        EXPECT_EQ(r.samples[s].tokens, reference.samples[s].tokens) << layout;
    }
  }
}

TEST(Generate, TheCachedLogitsAtEveryPositionAreTheForwardPassOverTheContext) {
  for (const std::string layout : {"one", "tp", "sp"}) {
    std::vector<std::vector<float>> rows(8);  // per position: sample 0's logits
    GenerateOptions o{.prompt = {3, 17, 4}, .max_new_tokens = 5, .sampling = {.temperature = 0}};
    o.on_logits = [&](const Tensor& logits, std::int64_t first) {
      const auto v = logits.data<float>();
      const std::size_t width = 32, count = v.size() / width;
      for (std::size_t j = 0; j < count; ++j)
        rows[static_cast<std::size_t>(first) + j].assign(
            v.begin() + static_cast<long>(j * width),
            v.begin() + static_cast<long>((j + 1) * width));
    };
    const GenerateReport r = run(layout, o, "one");
    // The training graph's forward pass on one device over the context the generation made.
    const Model one = gpt("one");
    ReferenceModel ref = reference_load(one.pcg);
    const ValueId tokens = find_value(one.pcg, "tokens");
    Tensor ctx(DType::kInt64, {4, 8});
    std::vector<std::int64_t> context = {3, 17, 4};
    for (std::int64_t t : r.samples[0].tokens) context.push_back(t);
    for (std::size_t b = 0; b < 4; ++b)
      for (std::size_t j = 0; j < 8; ++j) ctx.data<std::int64_t>()[b * 8 + j] = context[j];
    ref.values[static_cast<std::size_t>(tokens)] = std::move(ctx);
    reference_forward(ref);
    const Tensor& logits = ref.values[static_cast<std::size_t>(find_value(one.pcg, "logits"))];
    for (std::size_t p = 0; p < 7; ++p) {
      ASSERT_EQ(rows[p].size(), 32u) << layout << " position " << p;
      for (std::size_t c = 0; c < 32; ++c)
        EXPECT_NEAR(rows[p][c], logits.data<float>()[p * 32 + c], 2e-5)
            << layout << " position " << p << " logit " << c;
    }
  }
}

std::string error_of(const GenerateOptions& o, const Model& m) {
  try {
    generate(m, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Generate, BadOptionsAreOneLineErrorsNamingThem) {
  const Model m = gpt("tp");
  const SavedWeights weights = saved_weights(gpt("one"));
  const fs::path& w = weights.dir;
  auto with = [&](auto change) {
    GenerateOptions o{.weights = w, .prompt = {1, 2}, .max_new_tokens = 3};
    change(o);
    return error_of(o, m);
  };
  EXPECT_NE(with([](auto& o) { o.prompt.clear(); }).find("--prompt is empty"), std::string::npos);
  EXPECT_NE(with([](auto& o) {
              o.prompt = {1, 32};
            }).find("token 32 is outside the vocabulary of 32"),
            std::string::npos);
  EXPECT_NE(with([](auto& o) { o.max_new_tokens = 7; }).find("--max-new-tokens 7"),
            std::string::npos);
  EXPECT_NE(with([](auto& o) { o.max_new_tokens = 0; }).find("--max-new-tokens 0"),
            std::string::npos);
  EXPECT_NE(with([](auto& o) { o.num_samples = 0; }).find("--num-samples 0"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.sampling.top_k = 0; }).find("--top-k 0"), std::string::npos);
  fs::remove_all(w / "b1_wq");
  EXPECT_NE(with([](auto&) {}).find("no tensor \"b1_wq\""), std::string::npos);
  Model no_generate = gpt("tp");
  no_generate.generate = nullptr;
  EXPECT_NE(error_of({.weights = w, .prompt = {1}, .max_new_tokens = 2}, no_generate)
                .find("\"generate\" object"),
            std::string::npos);
}

TEST(Generate, WeightsOfAnotherShapeAreNamed) {
  const Model m = gpt("one");
  const SavedWeights weights = saved_weights(m);
  const fs::path& w = weights.dir;
  fs::remove_all(w / "head");
  Tensor small(DType::kFloat32, {16, 31});
  std::vector<Tensor> shards;
  shards.push_back(std::move(small));
  write_sharded(w / "head", make_layout(make_mesh({1}, {0}), {Placement::replicate()}, {16, 31}),
                shards);
  const std::string e = error_of({.weights = w, .prompt = {1}, .max_new_tokens = 2}, m);
  EXPECT_NE(e.find("tensor \"head\" is float32[16, 31] but the model says float32[16, 32]"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace meshflow
