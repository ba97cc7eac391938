#!/usr/bin/python3
"""Converts the PyTorch GPT of gpt.py to a meshflow model file with a DTensor-style plan,
trains it over a dataset with meshflow, generates from it, and loads the trained weights back
into the PyTorch module (docs/torch.md).

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/torch/train_gpt.py [--text FILE]
        [--mesh 2x2] [--steps 300] [--out DIR]

The text defaults to Debian's fortunes where installed (else this folder's Python sources); it
is tokenized byte by byte into DIR/data by `meshflow data prepare`.
"""
import argparse
import pathlib
import sys

import torch

import meshflow as mf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpt import GPT, GPTConfig  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--text", nargs="*", type=pathlib.Path)
parser.add_argument("--mesh", default="2x2")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("torch_gpt"))
args = parser.parse_args()

fortunes = pathlib.Path("/usr/share/games/fortunes/fortunes")
text = args.text or ([fortunes] if fortunes.exists()
                     else sorted(pathlib.Path(__file__).resolve().parent.glob("*.py")))
args.out.mkdir(parents=True, exist_ok=True)
data = args.out / "data"
print(mf.data.prepare(text, data, separator="%" if text == [fortunes] else None))

# The module, as a PyTorch user has it.
torch.manual_seed(0)
config = GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64)
model = GPT(config)
example = torch.zeros(args.batch, config.block_size, dtype=torch.long)

# DTensor's plan: Megatron's tensor parallelism over the mesh's last dim, data parallelism over
# the other; the fused q/k/v projection is colwise per head.
plan = {
    "transformer.h.*.attn.c_attn": "colwise",
    "transformer.h.*.attn.c_proj": "rowwise",
    "transformer.h.*.mlp.c_fc": "colwise",
    "transformer.h.*.mlp.c_proj": "rowwise",
    "transformer.wte": "vocab",
    "lm_head": "colwise",
    "*": "replicate",
}
converted = mf.from_torch(
    model, (example, example), mesh=args.mesh, plan=plan, out=args.out / "gpt.json",
    data={"idx": {"data": "window"}, "targets": {"data": "window", "shift": 1},
          "data": {"train": str(data / "train.npy"), "val": str(data / "val.npy")}})

result = converted.train(args.steps, optimizer="adamw", lr=3e-3, warmup_steps=20,
                         decay="cosine", decay_steps=args.steps - 20, eval_every=100,
                         eval_batches=10, checkpoint=args.out / "ck", keep_last=1)
print(f"loss {result['steps'][0]['loss']:.3f} -> {result['steps'][-1]['loss']:.3f}, "
      f"val {result['evals'][-1]['val_loss']:.3f}")

sample = converted.generate(args.out / "ck", "Q: ", max_new_tokens=60, temperature=0.8,
                            top_k=40, seed=1, tokenizer=data)
print(sample["samples"][0]["text"])

# Back to PyTorch: the trained weights under the module's own names.
model.load_state_dict(mf.to_torch_state_dict(args.out / "ck"), strict=True)
idx = torch.tensor([list(b"Q: What")], dtype=torch.long)
print("PyTorch continues with:", bytes([int(model(idx)[0][0, -1].argmax())]))
