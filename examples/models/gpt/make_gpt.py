#!/usr/bin/python3
"""Writes the GPT example: its token data and one model file per layout (the same model, the same
weights, placed six ways, and two pipelines of it). Run it from any folder; the files land beside
this script (or in the folder given as its argument), and running it again rewrites them
unchanged (the data is seeded).
--batch, --seq, --vocab, --dim, --heads and --blocks write a model of another size (the
checked-in files use the defaults); --devices sets the size of the 1-d meshes (dp, tp, tp_vocab,
sp). This script is the GPT's one definition: `meshflow bench train` runs it (built into the
binary) to write the bench's GPT (width 512, 8 heads, 2 blocks, batch 8, sequence 256, vocabulary
8192).

The model: a token embedding plus a learned position embedding, BLOCKS pre-norm blocks (causal
multi-head self-attention, then a GELU MLP, each added back into the residual stream), a final
layer norm, an LM head and the softmax cross-entropy of the next token.

--data DIR writes the model files over a prepared token stream instead (DIR/train.npy and
DIR/val.npy, as `meshflow data prepare` writes them; --vocab must cover its ids): the tokens and
next tokens are [B, S] windows of it (next with shift 1, reshaped to [-1] before the loss), and a
"generate" object names the token input and the logits. Without --data the script also writes a
dataset of its own (data/train.npy and data/val.npy: a seeded first-order Markov source over the
vocabulary, so the loss can fall well below ln V) and gpt_<layout>_data.json files that read it.
--init gpt2 initialises as GPT-2 and nanoGPT do: every weight normal with std 0.02, biases zero,
norm scales one (a first loss near ln V).

The layouts, on --devices (4) devices unless named:
  one       1 device, every tensor whole
  dp        data parallel: the batch split, every weight replicated
  tp        Megatron tensor parallel: q, k, v and the MLP's first weight split by columns (heads
            split over devices), the output projections by rows; embeddings and head replicated
  tp_vocab  tp with a vocabulary-parallel token embedding and LM head
  sp        tp_vocab with sequence parallelism: the residual stream, the layer norms and the
            residual adds split on the sequence dim, gathered into each block's first products
            and reduce-scattered out of its last
  dp_tp     data x tensor parallel on a 2x2 mesh: the batch split over dp, tp as above over tp
  pp        a pipeline of 4 stages of one device, one block each (this layout's model has 4
            blocks; the embeddings live on the first stage, the final norm and head on the last)
  pp_dp_tp  a pipeline of 2 stages, each on its own 2x2 mesh laid out as dp_tp (8 devices), the
            blocks split evenly between them
"""
import argparse
import json
import os
import pathlib

import numpy as np

parser = argparse.ArgumentParser(description="Writes the GPT example's data and model files.")
parser.add_argument("out", nargs="?", type=pathlib.Path,
                    help="the folder to write (default: this script's)")
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seq", type=int, default=8)
parser.add_argument("--vocab", type=int, default=32)
parser.add_argument("--dim", type=int, default=16, help="the width, a multiple of --heads")
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--blocks", type=int, default=2)
parser.add_argument("--devices", type=int, default=4, help="devices of the 1-d meshes")
parser.add_argument("--data", type=pathlib.Path,
                    help="a folder holding train.npy and val.npy: write model files that read it")
parser.add_argument("--init", choices=["default", "gpt2"], default="default",
                    help="gpt2: weights normal(0.02), biases zero, norm scales one")
parser.add_argument("--order", choices=["shuffled", "sequential", "random"], default="shuffled",
                    help="with data: the order batches read it in")
args = parser.parse_args()
for name in ("batch", "seq", "vocab", "dim", "heads", "blocks", "devices"):
    if getattr(args, name) < 1:
        parser.error(f"--{name} {getattr(args, name)}: must be >= 1")
if args.dim % args.heads:
    parser.error(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
here = args.out or pathlib.Path(__file__).resolve().parent
BATCH, SEQ, VOCAB = args.batch, args.seq, args.vocab
DIM, HEADS, BLOCKS, DEVICES = args.dim, args.heads, args.blocks, args.devices
HIDDEN = 4 * DIM


def layouts():
    """Per layout: its mesh, and the placements of each kind of tensor and residual value."""
    r1, r2 = ["R"], ["R", "R"]
    tp = {"col": ["S(1)"], "row": ["S(0)"], "vec": r1, "embed": r1, "head": r1,
          "residual": r1, "split": ["S(2)"]}
    return {
        "one": {"mesh": "1", "data": r1, "col": r1, "row": r1, "vec": r1, "embed": r1,
                "head": r1},
        "dp": {"mesh": str(DEVICES), "data": ["S(0)"], "col": r1, "row": r1, "vec": r1, "embed": r1,
               "head": r1},
        "tp": {"mesh": str(DEVICES), "data": r1, **tp},
        "tp_vocab": {"mesh": str(DEVICES), "data": r1, **tp, "embed": ["S(0)"], "head": ["S(1)"],
                     "logits": ["S(2)"]},
        "sp": {"mesh": str(DEVICES), "data": r1, **tp, "embed": ["S(0)"], "head": ["S(1)"],
               "logits": ["S(2)"], "residual": ["S(1)"], "gather": r1},
        "dp_tp": {"mesh": "2x2", "data": ["S(0)", "R"], "col": ["R", "S(1)"],
                  "row": ["R", "S(0)"], "vec": r2, "embed": r2, "head": r2,
                  "residual": ["S(0)", "R"], "split": ["S(0)", "S(2)"]},
        "pp": {"stages": ["1@0", "1@1", "1@2", "1@3"], "blocks": max(BLOCKS, 4), "data": r1,
               "col": r1, "row": r1, "vec": r1, "embed": r1, "head": r1},
        "pp_dp_tp": {"stages": ["2x2@0,1,2,3", "2x2@4,5,6,7"], "blocks": max(BLOCKS, 2),
                     "data": ["S(0)", "R"], "col": ["R", "S(1)"], "row": ["R", "S(0)"],
                     "vec": r2, "embed": r2, "head": r2, "residual": ["S(0)", "R"],
                     "split": ["S(0)", "S(2)"]},
    }


def model(layout, data=None):
    """The model of `layout`; with `data` (the "data" object), its tokens read windows of it."""
    p = layout
    tensors, nodes = {}, []
    seed = iter(range(1, 1000))
    stages = p.get("stages", [p.get("mesh")])
    blocks = p.get("blocks", BLOCKS)
    # The mesh everything is placed on now: "m", or the stage of the block being written.
    at = {"mesh": "m" if "mesh" in p else "s0"}

    def weight(name, shape, kind, init, role="weight"):
        s = next(seed)
        if args.init == "gpt2":
            init = {"zeros": True} if role == "bias" else (
                {"uniform": [1.0, 1.0]} if role == "scale" else {"normal": 0.02})
        spec = dict(init) if "zeros" in init else {**init, "seed": s}
        tensors[name] = {"shape": shape, "weight": spec, "mesh": at["mesh"],
                         "placements": p[kind]}
        return name

    def node(name, op, inputs, **attrs):
        if "stages" in p:
            attrs["mesh"] = at["mesh"]
        nodes.append({"name": name, "op": op, "inputs": inputs, **attrs})
        return name

    def pinned(name, op, inputs, kind, **attrs):
        # Tensor-parallel layouts pin the residual stream and the column-parallel products, so
        # the example shows Megatron's layout itself rather than whatever the cost model finds
        # cheapest at this toy size; the others leave every value to sharding propagation.
        if kind in p:
            attrs["placements"] = p[kind]
        return node(name, op, inputs, **attrs)

    def residual(name, op, inputs, **attrs):
        return pinned(name, op, inputs, "residual", **attrs)

    def layer_norm(name, x):
        w = weight(f"{name}_w", [DIM], "vec", {"uniform": [0.9, 1.1]}, "scale")
        b = weight(f"{name}_b", [DIM], "vec", {"normal": 0.02}, "bias")
        n = residual(name, "layer_norm", [x, w, b])
        if "gather" not in p:
            return n
        # Sequence parallelism's all-gather into the column-parallel products (its backward a
        # reduce-scatter), written as FlexFlow's combine.
        return node(f"{name}_all", "combine", [n], dim=1, degree=DEVICES,
                    placements=p["gather"])

    dh = DIM // HEADS
    last = "m" if "mesh" in p else f"s{len(stages) - 1}"
    if data is None:
        tensors["tokens"] = {"shape": [BATCH, SEQ], "dtype": "int64", "input": "tokens.npy",
                             "mesh": at["mesh"], "placements": p["data"]}
        tensors["next"] = {"shape": [BATCH * SEQ], "dtype": "int64", "input": "next_tokens.npy",
                           "mesh": last, "placements": p["data"]}
    else:
        tensors["tokens"] = {"shape": [BATCH, SEQ], "dtype": "int64",
                             "input": {"data": "window"}, "mesh": at["mesh"],
                             "placements": p["data"]}
        tensors["next"] = {"shape": [BATCH, SEQ], "dtype": "int64",
                           "input": {"data": "window", "shift": 1}, "mesh": last,
                           "placements": p["data"]}
    tok = weight("tok", [VOCAB, DIM], "embed", {"normal": 0.5})
    pos = weight("pos", [SEQ, DIM], "vec", {"normal": 0.1})
    node("e", "embedding", ["tokens", tok])
    # Each block's input (and the final norm's) is marked "checkpoint": what --recompute full
    # keeps, recomputing one block at a time from it in backward.
    x = residual("x0", "add", ["e", pos], checkpoint=True)
    for i in range(blocks):
        if "stages" in p:
            at["mesh"] = f"s{i * len(stages) // blocks}"
        b = f"b{i}"
        n = layer_norm(f"{b}_ln1", x)
        heads = []
        for part in "qkv":
            w = weight(f"{b}_w{part}", [DIM, DIM], "col", {"normal": 0.3})
            pinned(f"{b}_{part}", "linear", [n, w], "split")
            node(f"{b}_{part}4", "reshape", [f"{b}_{part}"], shape=[-1, SEQ, HEADS, dh])
            heads.append(node(f"{b}_{part}h", "transpose", [f"{b}_{part}4"], dims=[0, 2, 1, 3]))
        node(f"{b}_att", "attention", heads, causal=True)
        node(f"{b}_at", "transpose", [f"{b}_att"], dims=[0, 2, 1, 3])
        node(f"{b}_a", "reshape", [f"{b}_at"], shape=[-1, SEQ, DIM])
        wo = weight(f"{b}_wo", [DIM, DIM], "row", {"normal": 0.3})
        node(f"{b}_o", "linear", [f"{b}_a", wo])
        x = residual(f"{b}_x1", "add", [x, f"{b}_o"])
        n = layer_norm(f"{b}_ln2", x)
        w1 = weight(f"{b}_w1", [DIM, HIDDEN], "col", {"normal": 0.2})
        w2 = weight(f"{b}_w2", [HIDDEN, DIM], "row", {"normal": 0.1})
        pinned(f"{b}_h", "linear", [n, w1], "split")
        node(f"{b}_g", "gelu", [f"{b}_h"])
        node(f"{b}_m", "linear", [f"{b}_g", w2])
        x = residual(f"{b}_x2", "add", [x, f"{b}_m"], checkpoint=True)
    at["mesh"] = last
    n = layer_norm("lnf", x)
    head = weight("head", [DIM, VOCAB], "head", {"normal": 0.3})
    pinned("logits", "linear", [n, head], "logits")
    node("flat", "reshape", ["logits"], shape=[-1, VOCAB])
    labels = "next"
    if data is not None:
        labels = node("next_flat", "reshape", ["next"], shape=[-1])
    node("loss", "softmax_cross_entropy", ["flat", labels])
    meshes = {"m": p["mesh"]} if "mesh" in p else {f"s{k}": m for k, m in enumerate(stages)}
    out = {"meshes": meshes, "tensors": tensors, "nodes": nodes, "loss": "loss",
           "outputs": ["loss"]}
    if data is not None:
        out = {"data": data, **out, "generate": {"tokens": "tokens", "logits": "logits"}}
    return out


def write_json(path, m):
    """One tensor or node per line, so a diff of two layouts reads line by line."""
    lines = ["{"]
    if "data" in m:
        lines.append(f'  "data": {json.dumps(m["data"])},')
    lines += [f'  "meshes": {json.dumps(m["meshes"])},', '  "tensors": {']
    items = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in m["tensors"].items()]
    lines += [",\n".join(items), "  },", '  "nodes": [']
    lines += [",\n".join(f"    {json.dumps(n)}" for n in m["nodes"]), "  ],"]
    lines += [f'  "loss": {json.dumps(m["loss"])},', f'  "outputs": {json.dumps(m["outputs"])}']
    if "generate" in m:
        lines[-1] += ","
        lines.append(f'  "generate": {json.dumps(m["generate"])}')
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def relative(path):
    """`path` as the model files in `here` name it."""
    return os.path.relpath(path.resolve(), here.resolve())


def markov_stream(rng, tokens):
    """A first-order Markov chain over the vocabulary: each token is followed by one of 4 tokens
    of its own (a seeded table), with seeded probabilities, so the next token is learnable
    (the loss can fall to about 1 nat, where ln V is the uniform guess's)."""
    successors = rng.integers(0, VOCAB, size=(VOCAB, 4))
    cum = np.cumsum(rng.dirichlet(np.full(4, 0.5), size=VOCAB), axis=1)
    u = rng.random(tokens)
    out = np.empty(tokens, dtype=np.uint16 if VOCAB <= 65536 else np.int64)
    t = 0
    for i in range(tokens):
        t = successors[t, min(int(np.searchsorted(cum[t], u[i], side="right")), 3)]
        out[i] = t
    return out


here.mkdir(parents=True, exist_ok=True)
if args.data is not None:
    for split in ("train", "val"):
        if not (args.data / f"{split}.npy").exists():
            parser.error(f"--data {args.data}: {split}.npy is missing")
    data = {"train": relative(args.data / "train.npy"), "val": relative(args.data / "val.npy"),
            "order": args.order, "seed": 0}
    for name, layout in layouts().items():
        write_json(here / f"gpt_{name}.json", model(layout, data))
else:
    rng = np.random.default_rng(2026)
    np.save(here / "tokens.npy", rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64))
    np.save(here / "next_tokens.npy", rng.integers(0, VOCAB, size=BATCH * SEQ).astype(np.int64))
    for name, layout in layouts().items():
        write_json(here / f"gpt_{name}.json", model(layout))
    # The example dataset: 200,000 train and 20,000 val tokens of one Markov source.
    (here / "data").mkdir(exist_ok=True)
    stream = markov_stream(np.random.default_rng(58), 220_000)
    np.save(here / "data" / "train.npy", stream[:200_000])
    np.save(here / "data" / "val.npy", stream[200_000:])
    data = {"train": "data/train.npy", "val": "data/val.npy", "order": args.order, "seed": 0}
    for name, layout in layouts().items():
        write_json(here / f"gpt_{name}_data.json", model(layout, data))
