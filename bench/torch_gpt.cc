#include "bench/torch_gpt.h"

#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "bench/torch_gpt_script.h"
#include "meshflow/core/error.h"

namespace meshflow::bench {

namespace fs = std::filesystem;

namespace {

// Converts the GPT (and a 12-block one, timed), then runs PyTorch eager's AdamW on the batches
// the converted model reads; prints one JSON object.
std::string script(const TorchGptOptions& o, const fs::path& folder) {
  const GptConfig& c = o.config;
  return fmt::format(
      "import json, sys, time\n"
      "import numpy as np\n"
      "try:\n"
      "    import torch\n"
      "    import meshflow as mf\n"
      "except ImportError as e:\n"
      "    print(json.dumps({{'missing': str(e)}})); sys.exit(0)\n"
      "sys.path.insert(0, {dir})\n"
      "from gpt import GPT, GPTConfig\n"
      "torch.set_num_threads({threads}); torch.manual_seed(0)\n"
      "np.save({dir} + '/train.npy', np.random.default_rng(0).integers(0, {v}, 400000)"
      ".astype(np.uint16))\n"
      "def config(layers): return GPTConfig(block_size={s}, vocab_size={v}, n_layer=layers, "
      "n_head={h}, n_embd={d})\n"
      "idx = torch.zeros({b}, {s}, dtype=torch.long)\n"
      "data = {{'idx': {{'data': 'window'}}, 'targets': {{'data': 'window', 'shift': 1}}, "
      "'data': {{'train': {dir} + '/train.npy', 'order': 'sequential'}}}}\n"
      "t = time.perf_counter()\n"
      "big = GPT(config(12))\n"
      "mf.from_torch(big, (idx, idx), mesh={mesh}, data=data, out={dir} + '/gpt12/gpt.json')\n"
      "convert12 = time.perf_counter() - t\n"
      "del big\n"
      "m = GPT(config({l}))\n"
      "t = time.perf_counter()\n"
      "model = mf.from_torch(m, (idx, idx), mesh={mesh}, data=data, out={dir} + '/gpt.json')\n"
      "convert = time.perf_counter() - t\n"
      "batches = mf.data.batches(model, steps=(1, {steps}))\n"
      "opt = torch.optim.AdamW(m.parameters())\n"
      "times = []\n"
      "for b in batches:\n"
      "    ids, tgt = torch.from_numpy(b['idx']), torch.from_numpy(b['targets'])\n"
      "    t = time.perf_counter()\n"
      "    opt.zero_grad(); m(ids, tgt)[1].backward(); opt.step()\n"
      "    times.append(time.perf_counter() - t)\n"
      "print(json.dumps({{'convert_s': convert, 'convert_12_blocks_s': convert12, "
      "'pytorch_s': times[{warmup}:]}}))\n",
      fmt::arg("dir", nlohmann::json(folder.string()).dump()), fmt::arg("threads", o.threads),
      fmt::arg("b", c.batch), fmt::arg("s", c.seq), fmt::arg("d", c.width), fmt::arg("h", c.heads),
      fmt::arg("v", c.vocab), fmt::arg("l", c.blocks),
      fmt::arg("mesh", nlohmann::json(o.mesh).dump()), fmt::arg("steps", o.steps + o.warmup),
      fmt::arg("warmup", o.warmup));
}

}  // namespace

std::optional<TorchGpt> convert_torch_gpt(const TorchGptOptions& o, const fs::path& folder) {
  check_gpt_config(o.config);
  {
    std::ofstream f(folder / "gpt.py");
    f << kTorchGptPy;
    if (!f) fail(ErrorKind::kIo, "{}: cannot write", (folder / "gpt.py").string());
  }
  CommandOutput run = run_command({"/usr/bin/python3", "-c", script(o, folder)},
                                  {fmt::format("PYTHONPATH={}", kMeshflowPythonDir),
                                   fmt::format("OMP_NUM_THREADS={}", o.threads)},
                                  /*with_errors=*/true);
  // The script's last line is its JSON (warnings may come before it on standard error).
  std::string& out = run.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const auto at = out.rfind('\n');
  const std::string last = out.substr(at == std::string::npos ? 0 : at + 1);
  const nlohmann::json parsed = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
  const std::optional<nlohmann::json> j =
      run.status == 0 && parsed.is_object() ? std::optional(parsed) : std::nullopt;
  if (!j) {
    fail(ErrorKind::kInvalidArgument, "converting the bench's PyTorch GPT failed: {}",
         last.empty() ? "no output" : last);
  }
  if (j->contains("missing")) {
    std::cerr << fmt::format("torch_gpt: skipped ({})\n", (*j)["missing"].get<std::string>());
    return std::nullopt;
  }
  return TorchGpt{.model = folder / "gpt.json",
                  .pytorch_s = (*j)["pytorch_s"].get<std::vector<double>>(),
                  .convert_s = (*j)["convert_s"].get<double>(),
                  .convert_12_blocks_s = (*j)["convert_12_blocks_s"].get<double>()};
}

}  // namespace meshflow::bench
