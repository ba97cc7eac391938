#!/usr/bin/python3
"""Writes the example models' input data (seeded, so the files never change): run it from any
folder; the .npy files land beside this script."""
import pathlib

import numpy as np

here = pathlib.Path(__file__).resolve().parent
rng = np.random.default_rng(2026)


def save(name, array):
    np.save(here / name, array)


# The MLPs: 64 samples of 32 features, 10 classes.
save("x.npy", rng.standard_normal((64, 32)).astype(np.float32))
save("y.npy", rng.integers(0, 10, size=64).astype(np.int64))
# FlexFlow's end-to-end graphs: an 8x6 target for the mse loss.
save("target.npy", rng.standard_normal((8, 6)).astype(np.float32))
save("target4.npy", rng.standard_normal((8, 4)).astype(np.float32))
# The attention block: 4 sequences of 8 tokens from a vocabulary of 16, and the next tokens.
save("tokens.npy", rng.integers(0, 16, size=(4, 8)).astype(np.int64))
save("next_tokens.npy", rng.integers(0, 16, size=32).astype(np.int64))

# The MLPs' dataset: sample arrays of 32 features labelled by a fixed random teacher (a tanh layer
# and an argmax over 10 classes), 4,096 to train on and 512 to validate with; and model files
# that read it (dp_mlp_data.json, tp_mlp_data.json, dp_tp_mlp_data.json).
teacher = np.random.default_rng(58)
w_in = teacher.standard_normal((32, 48)) / np.sqrt(32)
w_out = teacher.standard_normal((48, 10)) / np.sqrt(48)
(here / "mlp_data").mkdir(exist_ok=True)
for split, n in (("train", 4096), ("val", 512)):
    x = teacher.standard_normal((n, 32)).astype(np.float32)
    y = np.argmax(np.tanh(x @ w_in) @ w_out, axis=1).astype(np.int64)
    save(f"mlp_data/{split}_x.npy", x)
    save(f"mlp_data/{split}_y.npy", y)

DATA = {"train": {"x": "mlp_data/train_x.npy", "y": "mlp_data/train_y.npy"},
        "val": {"x": "mlp_data/val_x.npy", "y": "mlp_data/val_y.npy"}, "order": "shuffled",
        "seed": 0}


def with_data(name):
    """The model file `name`.json reading the dataset: its x and y become data inputs."""
    import json
    m = json.loads((here / f"{name}.json").read_text())
    m["tensors"]["x"]["input"] = {"data": "x"}
    m["tensors"]["y"]["input"] = {"data": "y"}
    m = {"data": DATA, **m}
    lines = ["{", f'  "data": {json.dumps(m["data"])},', f'  "meshes": {json.dumps(m["meshes"])},',
             '  "tensors": {']
    lines.append(",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}"
                            for k, v in m["tensors"].items()))
    lines += ["  },", '  "nodes": [', ",\n".join(f"    {json.dumps(n)}" for n in m["nodes"]),
              "  ],", f'  "loss": {json.dumps(m["loss"])},',
              f'  "outputs": {json.dumps(m["outputs"])}', "}"]
    (here / f"{name}_data.json").write_text("\n".join(lines) + "\n")


for name in ("dp_mlp", "tp_mlp", "dp_tp_mlp"):
    with_data(name)
