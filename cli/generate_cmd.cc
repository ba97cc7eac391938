// `meshflow generate`: a prompt continued by a model file's logits on its own meshes (DESIGN.md
// "Generation"), printed as it arrives or as JSON.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "meshflow/core/error.h"
#include "meshflow/data/tokenizer.h"
#include "meshflow/infer/generate.h"
#include "meshflow/infer/text_stream.h"

namespace meshflow::cli {

namespace {

// Returns the ids of "3 17 4"; throws naming --prompt for anything else.
std::vector<std::int64_t> prompt_ids(const std::string& text) {
  std::vector<std::int64_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',') {
      ++i;
      continue;
    }
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
    if (ec != std::errc() || (end != text.data() + text.size() && *end != ' ' && *end != ','))
      fail(ErrorKind::kInvalidArgument,
           "--prompt \"{}\": without --tokenizer the prompt is token ids (\"3 17 4\")", text);
    ids.push_back(v);
    i = static_cast<std::size_t>(end - text.data());
  }
  return ids;
}

struct GenerateArgs {
  std::string model, weights, prompt, tokenizer, backend;
  int max_new_tokens = 100, num_samples = 1, threads_per_device = 0;
  double timeout_s = 60;
  double temperature = 1;
  std::optional<int> top_k;
  std::optional<double> top_p;
  std::uint64_t seed = 0;
  std::vector<std::string> stop;
  bool no_cache = false, json = false;
};

void run_generate(const GenerateArgs& args, Backend backend) {
  const GenerateArgs* a = &args;
  GenerateOptions o;
  o.run.backend = backend;
  o.run.threads_per_device = a->threads_per_device;
  o.run.timeout = timeout_of_seconds(a->timeout_s);
  o.weights = a->weights;
  o.max_new_tokens = a->max_new_tokens;
  o.num_samples = a->num_samples;
  o.sampling = {
      .temperature = a->temperature, .top_k = a->top_k, .top_p = a->top_p, .seed = a->seed};
  o.cache = !a->no_cache;
  for (const std::string& s : a->stop)
    if (s.empty()) fail(ErrorKind::kInvalidArgument, "--stop is empty");
  std::optional<Tokenizer> tokenizer;
  if (!a->tokenizer.empty()) {
    tokenizer = Tokenizer::load(a->tokenizer);
    o.prompt = tokenizer->encode(a->prompt);
    o.tokenizer_vocabulary = tokenizer->vocab_size();
  } else {
    o.prompt = prompt_ids(a->prompt);
  }
  const Model model = load_model(a->model);
  const Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  std::vector<TextStream> texts(static_cast<std::size_t>(std::max(1, a->num_samples)),
                                TextStream{.tokenizer = tok});
  // The prompt is printed once the first token came (so an error prints nothing).
  bool started = false;
  auto start = [&] {
    if (started || a->json) return;
    started = true;
    fmt::print("{}", tok ? a->prompt : a->prompt + " ");
  };
  const GenerateReport r = generate(model, o, [&](int sample, std::int64_t token) {
    TextStream& s = texts[static_cast<std::size_t>(sample)];
    const std::string part = push_token(s, token);
    if (sample == 0 && !a->json) {
      start();
      fmt::print("{}", part);
      std::fflush(stdout);
    }
    return ends_with_any(s, a->stop);
  });
  if (!r.reporter) return;
  if (a->json) {
    fmt::print("{}\n", generation_json(r, o.prompt, texts).dump(2));
    return;
  }
  start();
  fmt::print("{}\n", finish_text(texts[0]));
  for (std::size_t i = 1; i < r.samples.size(); ++i)
    fmt::print("---\n{}{}\n", tok ? a->prompt : a->prompt + " ", whole_text(texts[i]));
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a model file's logits on its own meshes, with a KV cache");
  cmd->add_option("model", a->model, "the model file (JSON) with a \"generate\" object")
      ->required();
  cmd->add_option("--weights", a->weights,
                  "a --save folder or a checkpoint (DIR or DIR/step-<k>), in any layouts")
      ->required();
  cmd->add_option("--prompt", a->prompt, "the text to continue (token ids without --tokenizer)")
      ->required();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "a tokenizer folder (data prepare's output): the prompt and output are text");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "new tokens per sample, N >= 1")
      ->capture_default_str();
  cmd->add_option("--num-samples", a->num_samples, "samples, generated as one batch, R >= 1")
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "T >= 0; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "keep the K most likely tokens, K >= 1");
  cmd->add_option("--top-p", a->top_p, "keep the most likely tokens up to probability P in (0, 1]");
  cmd->add_option("--seed", a->seed, "the sampling seed (the same tokens on any mesh)")
      ->capture_default_str();
  cmd->add_option("--stop", a->stop, "end a sample once its text ends with TEXT (repeatable)");
  cmd->add_flag("--no-cache", a->no_cache,
                "run the whole context for every new token (the reference the cache equals)");
  cmd->add_option("--backend", a->backend,
                  "threads or mpi (default: mpi under mpirun, else threads)");
  cmd->add_option("--threads-per-device", a->threads_per_device,
                  "threads each device computes with, >= 1 (default: this machine's cores divided "
                  "by the devices, at least 1)")
      ->check(CLI::Range(1, kMostThreads));
  cmd->add_option("--timeout", a->timeout_s,
                  "seconds a device may keep its peers waiting before generation fails (exit 3)")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print JSON: the tokens, text and logprobs of every sample");
  cmd->callback([a] {
    const Backend backend = backend_option(a->backend);
    try {
      run_generate(*a, backend);
    } catch (const Error& e) {
      // Every rank meets the same error in the same input: rank 0 reports it.
      if (backend != Backend::kMpi || e.scope() == ErrorScope::kEveryDevice) throw;
      throw Error(e.kind(), e.what(), ErrorScope::kEveryDevice);
    }
  });
}

}  // namespace meshflow::cli
