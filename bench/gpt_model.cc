#include "bench/gpt_model.h"

#include <fmt/format.h>

#include "bench/make_gpt_script.h"
#include "bench/report.h"
#include "meshflow/core/error.h"

namespace meshflow::bench {

namespace fs = std::filesystem;

void check_gpt_config(const GptConfig& c) {
  if (c.heads < 1 || c.width % c.heads != 0) {
    fail(ErrorKind::kInvalidArgument, "GPT width {} is not a multiple of its {} heads", c.width,
         c.heads);
  }
  if (c.blocks < 1) fail(ErrorKind::kInvalidArgument, "a GPT needs a block, not {}", c.blocks);
}

GptFiles::GptFiles(const GptConfig& c, int devices, const fs::path& data, const std::string& init) {
  check_gpt_config(c);
  std::vector<std::string> words = {"/usr/bin/python3",
                                    "-c",
                                    kMakeGptPy,
                                    folder_.path().string(),
                                    "--batch",
                                    std::to_string(c.batch),
                                    "--seq",
                                    std::to_string(c.seq),
                                    "--vocab",
                                    std::to_string(c.vocab),
                                    "--dim",
                                    std::to_string(c.width),
                                    "--heads",
                                    std::to_string(c.heads),
                                    "--blocks",
                                    std::to_string(c.blocks),
                                    "--devices",
                                    std::to_string(devices),
                                    "--init",
                                    init};
  if (!data.empty()) {
    words.push_back("--data");
    words.push_back(data.string());
  }
  CommandOutput run = run_command(words, {}, /*with_errors=*/true);
  if (run.status != 0) {  // the folder goes with the half-made object
    std::string& out = run.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const auto last_line = out.rfind('\n');
    fail(
        ErrorKind::kInvalidArgument, "writing the bench GPT (make_gpt.py) failed: {}",
        out.empty() ? "no output" : out.substr(last_line == std::string::npos ? 0 : last_line + 1));
  }
}

Model GptFiles::load(std::string_view layout) const { return load_model(path(layout)); }

// PyTorch's eager GPT of the same shape: torch.nn layers without biases in the products, and
// attention as eager PyTorch 1.13 computes it (the whole S x S scores per head).
std::string pytorch_gpt(const GptConfig& c, const std::string& optimizer) {
  return fmt::format(
      "B, S, D, H, V, L = {b}, {s}, {d}, {h}, {v}, {l}\n"
      "def lin(i, o): return torch.nn.Linear(i, o, bias=False)\n"
      "class Block(torch.nn.Module):\n"
      "    def __init__(s):\n"
      "        super().__init__()\n"
      "        s.ln1, s.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)\n"
      "        s.q, s.k, s.v, s.o = lin(D, D), lin(D, D), lin(D, D), lin(D, D)\n"
      "        s.w1, s.w2 = lin(D, 4 * D), lin(4 * D, D)\n"
      "    def forward(s, x):\n"
      "        n = s.ln1(x)\n"
      "        q, k, v = [f(n).view(B, S, H, D // H).transpose(1, 2) for f in (s.q, s.k, s.v)]\n"
      "        a = F.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H) + mask, dim=-1) @ v\n"
      "        x = x + s.o(a.transpose(1, 2).reshape(B, S, D))\n"
      "        return x + s.w2(F.gelu(s.w1(s.ln2(x))))\n"
      "mask = torch.triu(torch.full((S, S), float('-inf')), 1)\n"
      "tok, pos = torch.nn.Embedding(V, D), torch.nn.Parameter(torch.randn(S, D) * 0.1)\n"
      "blocks = torch.nn.ModuleList([Block() for _ in range(L)])\n"
      "lnf, head = torch.nn.LayerNorm(D), lin(D, V)\n"
      "params = [pos] + [p for m in (tok, blocks, lnf, head) for p in m.parameters()]\n"
      "opt = {opt}\n"
      "ids, nxt = torch.randint(0, V, (B, S)), torch.randint(0, V, (B * S,))\n"
      "def step():\n"
      "    opt.zero_grad(); x = tok(ids) + pos\n"
      "    for blk in blocks: x = blk(x)\n"
      "    F.cross_entropy(head(lnf(x)).view(B * S, V), nxt).backward(); opt.step()\n",
      fmt::arg("b", c.batch), fmt::arg("s", c.seq), fmt::arg("d", c.width), fmt::arg("h", c.heads),
      fmt::arg("v", c.vocab), fmt::arg("l", c.blocks), fmt::arg("opt", optimizer));
}

fs::path GptFiles::path(std::string_view layout) const {
  return folder_.path() / fmt::format("gpt_{}.json", layout);
}

}  // namespace meshflow::bench
