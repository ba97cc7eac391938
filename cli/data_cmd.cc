// `meshflow data batches`: what `train` feeds, written out for inspection (DESIGN.md "Data,
// evaluation and tokenizers").
#include <fmt/format.h>

#include <charconv>
#include <iostream>
#include <iterator>

#include "cli/commands.h"
#include "meshflow/comm/launch.h"
#include "meshflow/core/error.h"
#include "meshflow/data/prepare.h"
#include "meshflow/train/data_feed.h"

namespace meshflow::cli {

namespace {

// Returns A and B of "A:B" (or "A" alone: A and A), each >= 1 and A <= B.
std::pair<int, int> step_range(const std::string& text) {
  auto number = [&](std::string_view part) {
    int v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || end != part.data() + part.size() || v < 1)
      fail(ErrorKind::kInvalidArgument, "--steps \"{}\" is not A:B with 1 <= A <= B", text);
    return v;
  };
  const std::size_t colon = text.find(':');
  const std::string_view all(text);
  const int a = number(all.substr(0, colon));
  const int b = colon == std::string::npos ? a : number(all.substr(colon + 1));
  if (b < a) fail(ErrorKind::kInvalidArgument, "--steps \"{}\" is not A:B with 1 <= A <= B", text);
  return {a, b};
}

// `data prepare`, `data encode` and `data decode`: tokenizers.
void add_tokenizer_commands(CLI::App* group) {
  struct Prepare {
    std::vector<std::string> text;
    std::string out, tokenizer = "bytes", separator;
    std::int64_t vocab_size = 4096;
    double val_fraction = 0.1;
  };
  auto p = std::make_shared<Prepare>();
  CLI::App* prep = group->add_subcommand(
      "prepare",
      "Tokenize UTF-8 text files into DIR/train.npy and DIR/val.npy, with the tokenizer");
  prep->add_option("--text", p->text, "text files, concatenated in this order")->required();
  prep->add_option("--out", p->out, "the folder to write")->required();
  prep->add_option("--tokenizer", p->tokenizer, "bytes (ids are the byte values) or bpe")
      ->capture_default_str()
      ->check(CLI::IsMember({"bytes", "bpe"}));
  prep->add_option("--vocab-size", p->vocab_size, "bpe: the pieces of the model")
      ->capture_default_str();
  prep->add_option("--val-fraction", p->val_fraction,
                   "the val split's part: every ceil(1/F)-th document with --separator, else the "
                   "last F of the tokens")
      ->capture_default_str();
  prep->add_option("--separator", p->separator,
                   "a line that ends each document (fortune files: %)");
  prep->callback([p] {
    if (detect_backend() == Backend::kMpi && !prints_shared_errors()) return;
    PrepareOptions o{
        .out = p->out,
        .tokenizer = p->tokenizer == "bpe" ? TokenizerKind::kBpe : TokenizerKind::kBytes,
        .vocab_size = p->vocab_size,
        .val_fraction = p->val_fraction};
    for (const std::string& t : p->text) o.text.emplace_back(t);
    if (!p->separator.empty()) o.separator = p->separator;
    o.progress = [](std::string_view line) {
      fmt::print(stderr, "{}\n", line);
      std::fflush(stderr);
    };
    const PrepareReport r = prepare_data(o);
    fmt::print("train: {} tokens, val: {} tokens, {:.3g} bytes per token\n", r.train_tokens,
               r.val_tokens, r.bytes_per_token());
  });
  for (const bool encode : {true, false}) {
    auto dir = std::make_shared<std::string>();
    CLI::App* cmd = group->add_subcommand(
        encode ? "encode" : "decode",
        encode ? "Standard input's text to token ids, one per line"
               : "Token ids (whitespace-separated) on standard input to text");
    cmd->add_option("--tokenizer", *dir, "the folder data prepare wrote (tokenizer.json)")
        ->required();
    cmd->callback([dir, encode] {
      const Tokenizer t = Tokenizer::load(*dir);
      const std::string in((std::istreambuf_iterator<char>(std::cin)), {});
      if (encode) {
        std::string out;
        for (std::int64_t id : t.encode(in)) out += fmt::format("{}\n", id);
        std::fwrite(out.data(), 1, out.size(), stdout);
        return;
      }
      std::vector<std::int64_t> ids;
      std::size_t at = 0;
      while (true) {
        at = in.find_first_not_of(" \t\r\n", at);
        if (at == std::string::npos) break;
        const std::size_t end = std::min(in.find_first_of(" \t\r\n", at), in.size());
        std::int64_t v = 0;
        const auto [ptr, ec] = std::from_chars(in.data() + at, in.data() + end, v);
        if (ec != std::errc() || ptr != in.data() + end)
          fail(ErrorKind::kInvalidArgument, "standard input: \"{}\" is not a token id",
               in.substr(at, std::min<std::size_t>(end - at, 40)));
        ids.push_back(v);
        at = end;
      }
      const std::string text = t.decode(ids);
      std::fwrite(text.data(), 1, text.size(), stdout);
    });
  }
}

}  // namespace

void add_data(CLI::App& app) {
  CLI::App* group = app.add_subcommand("data", "Datasets: tokenizers, and the batches train feeds");
  group->require_subcommand(1);
  add_tokenizer_commands(group);
  struct Args {
    std::string model, split = "train", steps = "1:1", out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = group->add_subcommand(
      "batches", "Write the global batch train feeds at each step as DIR/step-<t>/<input>.npy");
  cmd->add_option("model", args->model, "the model file (JSON) with a \"data\" object")->required();
  cmd->add_option("--split", args->split, "train, or val (step t: eval batch t - 1)")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--steps", args->steps, "the steps A:B to write")->capture_default_str();
  cmd->add_option("--out", args->out, "the folder to write")->required();
  cmd->callback([args] {
    // Under mpirun one process writes the folder (every rank would read the same files).
    if (detect_backend() == Backend::kMpi && !prints_shared_errors()) return;
    const auto [first, last] = step_range(args->steps);
    const Model model = load_model(args->model);
    const std::optional<ModelData> data = read_model_data(model);
    if (!data) {
      fail(ErrorKind::kInvalidArgument, "{}: the model has no \"data\" object to read batches of",
           args->model);
    }
    write_batches(*data, args->split == "val", first, last, args->out);
    fmt::print("wrote steps {} to {} of the {} split in {}\n", first, last, args->split, args->out);
  });
}

}  // namespace meshflow::cli
