#include "meshflow/infer/decoder_graph.h"

#include <gtest/gtest.h>

#include <iostream>

#include "meshflow/graph/compile.h"

namespace meshflow {
namespace {

TEST(DecoderGraph, Debug) {
  Model m = load_model(std::string(MESHFLOW_EXAMPLES_DIR) + "/models/gpt/gpt_pp_dp_tp.json");
  m.generate = {{"tokens", "tokens"}, {"logits", "logits"}};
  GenerateNames names = generate_names(m);
  DecoderGraph plain = decoder_graph(m, names, {.batch = 2, .length = 3});
  Pcg c = compile(plain.pcg, Mode::kRun, {});
  auto layouts = decoder_cache_layouts(c, 7);
  DecoderGraph g = decoder_graph(m, names, {.batch = 2, .length = 3, .capacity = 7}, layouts);
  Pcg cc = compile(g.pcg, Mode::kRun, {});
  std::cout << to_text(cc);
}

}  // namespace
}  // namespace meshflow
