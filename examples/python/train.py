"""Train a model file (DP x TP MLP on a 2x2 mesh) and check it against one device."""

import pathlib

import meshflow as mf

model = mf.Model.load(pathlib.Path(__file__).resolve().parents[1] / "models" / "dp_tp_mlp.json")
report = model.train(5, lr=0.05, check=True)
if mf.rank() == 0:
    for s in report["steps"]:
        print(f"step {s['step']}  loss {s['loss']:.6f}")
    print("check against one device:", report["check"])
