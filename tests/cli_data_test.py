"""`meshflow data batches` and `train` over datasets (DESIGN.md "Data, evaluation and
tokenizers"), on threads and (with --mpi MPIRUN) under mpirun -n 4: the batches equal a NumPy
reproduction of the three orders; training over data equals one device on the GPT and MLP
layouts with evaluations; every mesh sees the same batches; a resumed run goes on from the saved
row; a 2 GiB stream trains in bounded memory; metrics.jsonl and loss.svg; every data error is one
line with exit 1.
Usage: cli_data_test.py MESHFLOW EXAMPLES_DIR [--mpi MPIRUN]"""
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import numpy as np

from checks import check, finish, run_meshflow
from philox import philox

meshflow, examples = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
TOLERANCE = 1e-5
make_gpt = os.path.join(examples, "gpt", "make_gpt.py")
tmp = tempfile.mkdtemp(prefix="meshflow_data_test_")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # however the script ends


def run(*args, ranks=None, timeout=300):
    return run_meshflow(meshflow, args, mpirun, ranks, timeout=timeout)


def reference_positions(order, seed, units, starts, window, first, count):
    """DESIGN's orders in NumPy: each row's first token (streams) or sample (arrays)."""
    rows = np.arange(first, first + count, dtype=np.int64)
    if order == "sequential":
        return (rows % units) * window
    if order == "random":
        w0, w1 = philox(rows.astype(np.uint64), seed, 0xFFFFFFFF)
        return ((w0 << np.uint64(32) | w1) % np.uint64(starts)).astype(np.int64)
    out = np.empty(count, dtype=np.int64)
    for e in np.unique(rows // units):
        w0, w1 = philox(np.arange(units, dtype=np.uint64), seed, int(e) + 1)
        keys = w0 << np.uint64(32) | w1
        pi = np.lexsort((np.arange(units), keys))  # by key, ties by unit
        sel = rows // units == e
        out[sel] = pi[rows[sel] % units]
    return out * window


def write_bin(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def stream_model(path, data, batch, seq, shifts, dtype="int64"):
    """A model whose only purpose is its data inputs (a tiny loss over an embedding)."""
    tensors = {f"t{k}": {"shape": [batch, seq], "dtype": dtype,
                         "input": {"data": "window", "shift": k}, "mesh": "m",
                         "placements": ["S(0)"]} for k in shifts}
    tensors["tab"] = {"shape": [70000, 2], "weight": {"normal": 0.1, "seed": 1}, "mesh": "m",
                      "placements": ["R"]}
    nodes = [{"name": "e", "op": "embedding", "inputs": [f"t{shifts[0]}", "tab"]},
             {"name": "loss", "op": "mean", "inputs": ["e"], "dims": [0, 1, 2]}]
    m = {"data": data, "meshes": {"m": "2"}, "tensors": tensors, "nodes": nodes, "loss": "loss",
         "outputs": ["loss"]}
    with open(path, "w") as f:
        json.dump(m, f)


def batches(model, steps, split="train"):
    out = tempfile.mkdtemp(dir=tmp, prefix="batches_")
    os.rmdir(out)
    r = run("data", "batches", model, "--steps", steps, "--split", split, "--out", out)
    check(r.returncode == 0, f"data batches {model} {steps} {split}: {r.stderr.strip()}")
    return out


# --- the orders, reproduced in NumPy -----------------------------------------------------------
def test_orders():
    rng = np.random.default_rng(5)
    a = rng.integers(0, 60000, size=301).astype(np.uint16)
    b = rng.integers(0, 60000, size=122).astype(np.int64)
    c = rng.integers(0, 60000, size=77).astype(np.uint16)
    np.save(os.path.join(tmp, "a.npy"), a)
    np.save(os.path.join(tmp, "b.npy"), b)
    write_bin(os.path.join(tmp, "c.bin"), c)
    stream = np.concatenate([a.astype(np.int64), b, c.astype(np.int64)])
    n, batch, seq = len(stream), 6, 16
    for order in ("shuffled", "sequential", "random"):
        for shifts in ([0], [0, 1]):
            data = {"train": ["a.npy", "b.npy", "c.bin"], "order": order, "seed": 11}
            path = os.path.join(tmp, f"s_{order}_{len(shifts)}.json")
            stream_model(path, data, batch, seq, shifts)
            k = max(shifts)
            units, starts = (n - k) // seq, n - seq - k + 1
            # Steps 1..6 span 36 rows: past W = 31 units, so one batch straddles two epochs.
            out = batches(path, "1:6")
            for t in range(1, 7):
                pos = reference_positions(order, 11, units, starts, seq, (t - 1) * batch, batch)
                for s in shifts:
                    want = np.stack([stream[p + s:p + s + seq] for p in pos])
                    got = np.load(os.path.join(out, f"step-{t}", f"t{s}.npy"))
                    check(np.array_equal(got, want), f"{order} shift {s} step {t}: batches differ")
    # Sample arrays: shuffled and sequential, val sequential from its start.
    x = rng.standard_normal((23, 3, 2)).astype(np.float32)
    y = rng.integers(0, 5, size=23).astype(np.int64)
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    for order in ("shuffled", "sequential"):
        data = {"train": {"x": "x.npy", "y": "y.npy"}, "val": {"x": "x.npy", "y": "y.npy"},
                "order": order, "seed": 3}
        m = {"data": data, "meshes": {"m": "2"},
             "tensors": {"x": {"shape": [5, 3, 2], "input": {"data": "x"}, "mesh": "m",
                               "placements": ["S(0)"]},
                         "y": {"shape": [5], "dtype": "int64", "input": {"data": "y"},
                               "mesh": "m", "placements": ["S(0)"]},
                         "w": {"shape": [2, 5], "weight": {"normal": 0.1, "seed": 1},
                               "mesh": "m", "placements": ["R"]}},
             "nodes": [{"name": "f", "op": "reshape", "inputs": ["x"], "shape": [-1, 2]},
                       {"name": "o", "op": "linear", "inputs": ["f", "w"]},
                       {"name": "loss", "op": "mean", "inputs": ["o"], "dims": [0, 1]}],
             "loss": "loss", "outputs": ["loss"]}
        path = os.path.join(tmp, f"arrays_{order}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        out = batches(path, "1:6")
        for t in range(1, 7):
            pos = reference_positions(order, 3, 23, 0, 1, (t - 1) * 5, 5)
            check(np.array_equal(np.load(os.path.join(out, f"step-{t}", "x.npy")), x[pos]),
                  f"arrays {order} step {t}: x differs")
            check(np.array_equal(np.load(os.path.join(out, f"step-{t}", "y.npy")), y[pos]),
                  f"arrays {order} step {t}: y differs")
        out = batches(path, "2:2", "val")
        pos = np.arange(5, 10) % 23
        check(np.array_equal(np.load(os.path.join(out, "step-2", "x.npy")), x[pos]),
              "val batch 1 is units 5..9")


# --- training over data -------------------------------------------------------------------------
def train_json(model, *args, ranks=None):
    r = run("train", model, "--json", *args, ranks=ranks)
    if r.returncode != 0:
        check(False, f"train {model} {' '.join(args)}: {r.stderr.strip()[-300:]}")
        return None
    return json.loads(r.stdout)


def gpt(name):
    return os.path.join(examples, "gpt", f"gpt_{name}_data.json")


def test_train_equals_one_device():
    layouts = ["tp", "dp_tp", "pp"] if mpirun else \
        ["one", "dp", "tp", "tp_vocab", "sp", "dp_tp", "pp", "pp_dp_tp"]
    for name in layouts:
        variants = [[], ["--micro-batches", "4"]]
        if not mpirun:
            # Every ZeRO level with 1 and 4 micro-batches.
            variants += [["--zero", z, "--optimizer", "adamw", *m] for z in ("1", "3")
                         for m in ([], ["--micro-batches", "4"])]
            if name.startswith("pp"):
                variants += [["--micro-batches", "4", "--schedule", s] for s in ("gpipe", "zb")]
        for extra in variants:
            d = train_json(gpt(name), "--steps", "2", "--check", "--eval-every", "1",
                           "--eval-batches", "2", *extra, ranks=4 if mpirun else None)
            if not d:
                continue
            c = d["check"]
            worst = max(c["max_loss_diff"], c["max_weight_diff"], c["max_val_loss_diff"])
            check(worst < TOLERANCE, f"gpt {name} {extra}: differs from one device by {worst}")
            check(len(d["evals"]) == 2, f"gpt {name} {extra}: {len(d['evals'])} evaluations")
            s = d["steps"][0]
            check(all(k in s for k in ("lr", "grad_norm", "data_wait_s", "samples_per_s",
                                       "tokens_per_s")), f"gpt {name}: step fields {sorted(s)}")
    if mpirun:
        return
    # Windows sharded on the sequence dim (S(1)), in micro-batches.
    m = json.load(open(gpt("sp")))
    for k in ("train", "val"):
        m["data"][k] = os.path.join(examples, "gpt", m["data"][k])
    for t in ("tokens", "next"):
        m["tensors"][t]["placements"] = ["S(1)"]
    seq = os.path.join(tmp, "gpt_seq.json")
    with open(seq, "w") as f:
        json.dump(m, f)
    d = train_json(seq, "--steps", "2", "--check", "--eval-every", "1", "--eval-batches", "2",
                   "--micro-batches", "2")
    if d:
        c = d["check"]
        worst = max(c["max_loss_diff"], c["max_weight_diff"], c["max_val_loss_diff"])
        check(worst < TOLERANCE, f"windows sharded on the sequence: {worst}")
    for name in ("dp_mlp", "tp_mlp", "dp_tp_mlp"):
        for extra in ([*m, "--zero", z, "--optimizer", "adamw"] for z in ("0", "1", "3")
                      for m in ([], ["--micro-batches", "4"])):
            d = train_json(os.path.join(examples, f"{name}_data.json"), "--steps", "2", "--check",
                           "--eval-every", "2", *extra)
            if d:
                c = d["check"]
                worst = max(c["max_loss_diff"], c["max_weight_diff"], c["max_val_loss_diff"])
                check(worst < TOLERANCE, f"{name} {extra}: differs from one device by {worst}")
                check(d["steps"][0]["tokens_per_s"] is None, f"{name}: tokens_per_s of samples")


def test_same_batches_on_every_mesh():
    if mpirun:
        return
    two = os.path.join(tmp, "gpt2dev")
    subprocess.run(["/usr/bin/python3", make_gpt, two, "--devices", "2", "--data",
                    os.path.join(examples, "gpt", "data")], check=True)
    losses = {}
    for label, path, extra in (("1", gpt("one"), []), ("2", os.path.join(two, "gpt_dp.json"), []),
                               ("4", gpt("dp"), []), ("2x2", gpt("dp_tp"), []),
                               ("2x2 M=2", gpt("dp_tp"), ["--micro-batches", "2"])):
        d = train_json(path, "--steps", "4", *extra)
        if d:
            losses[label] = [s["loss"] for s in d["steps"]]
    ref = losses.get("1")
    for label, l in losses.items():
        check(ref is not None and np.allclose(l, ref, atol=TOLERANCE, rtol=0),
              f"losses on {label} devices {l} differ from one device's {ref}")


def test_resume():
    ck = os.path.join(tmp, "ck")
    opts = ["--optimizer", "adamw", "--lr", "0.01"]
    whole = train_json(gpt("dp"), "--steps", "6", *opts)
    first = train_json(gpt("dp"), "--steps", "3", *opts, "--checkpoint", ck)
    rest = train_json(gpt("dp"), "--steps", "3", *opts, "--resume", ck)
    if whole and first and rest:
        check([s["loss"] for s in first["steps"] + rest["steps"]] ==
              [s["loss"] for s in whole["steps"]], "3 + resumed 3 steps differ from 6 steps")
    saved = json.load(open(os.path.join(ck, "step-3", "checkpoint.json")))["data"]
    check(saved["rows"] == 12 and saved["order"] == "shuffled", f"data position {saved}")
    if mpirun:
        return
    for name, extra in (("dp_tp", []), ("one", []), ("dp", ["--micro-batches", "2"])):
        d = train_json(gpt(name), "--steps", "3", *opts, "--resume", ck, "--check", *extra)
        if d and whole:
            l = [s["loss"] for s in d["steps"]]
            ok = np.allclose(l, [s["loss"] for s in whole["steps"][3:]], atol=TOLERANCE, rtol=0)
            check(ok, f"resumed on {name} {extra}: {l}")
            check(d["check"]["max_loss_diff"] < TOLERANCE, f"resumed on {name}: check")
    # A chain of meshes: DP 4 (steps 1-3), then DP x TP 2x2 (steps 4-5), then one device (6).
    chain = os.path.join(tmp, "chain")
    a = train_json(gpt("dp_tp"), "--steps", "2", *opts, "--resume", ck, "--checkpoint", chain)
    b = train_json(gpt("one"), "--steps", "1", *opts, "--resume", chain)
    if a and b and whole:
        l = [s["loss"] for s in a["steps"] + b["steps"]]
        check(np.allclose(l, [s["loss"] for s in whole["steps"][3:]], atol=TOLERANCE, rtol=0),
              f"DP 4 -> DP x TP -> one device: {l}")
    # Another batch size goes on from the saved row.
    half = os.path.join(tmp, "gpt_b2")
    subprocess.run(["/usr/bin/python3", make_gpt, half, "--batch", "2", "--data",
                    os.path.join(examples, "gpt", "data")], check=True)
    ck2 = os.path.join(tmp, "ck2")
    d = train_json(os.path.join(half, "gpt_dp.json"), "--steps", "2", *opts, "--resume", ck,
                   "--checkpoint", ck2, "--check")
    if d:
        check(d["check"]["max_loss_diff"] < TOLERANCE, "batch 2 resumed: check")
        rows = json.load(open(os.path.join(ck2, "step-5", "checkpoint.json")))["data"]["rows"]
        check(rows == 16, f"batch 2 after 12 rows and 2 steps: rows {rows}, not 16")
    # A checkpoint of another seed is refused.
    other = os.path.join(tmp, "gpt_seed")
    subprocess.run(["/usr/bin/python3", make_gpt, other, "--data",
                    os.path.join(examples, "gpt", "data"), "--order", "sequential"], check=True)
    r = run("train", os.path.join(other, "gpt_dp.json"), "--resume", ck, *opts)
    check(r.returncode == 1 and "data order is shuffled but the model's is sequential" in r.stderr,
          f"resume with another order: {r.stderr.strip()}")


def test_generator_over_data():
    """make_gpt.py --data DIR --init gpt2: model files over a prepared stream whose first loss
    is near ln V, with a "generate" object naming the token input and the logits."""
    if mpirun:
        return
    out = os.path.join(tmp, "gpt2")
    subprocess.run(["/usr/bin/python3", make_gpt, out, "--data",
                    os.path.join(examples, "gpt", "data"), "--init", "gpt2"], check=True)
    m = json.load(open(os.path.join(out, "gpt_one.json")))
    check(m.get("generate") == {"tokens": "tokens", "logits": "logits"},
          f"generate object {m.get('generate')}")
    check(m["tensors"]["next"]["input"] == {"data": "window", "shift": 1}, "next is a window")
    d = train_json(os.path.join(out, "gpt_one.json"), "--steps", "1")
    if d:
        check(abs(d["steps"][0]["loss"] - np.log(32)) < 0.05,
              f"--init gpt2's first loss {d['steps'][0]['loss']} is not near ln 32")


def test_metrics():
    if mpirun:
        return
    logs = os.path.join(tmp, "logs")
    r = run("train", gpt("dp"), "--steps", "5", "--eval-every", "2", "--eval-batches", "3",
            "--log-dir", logs)
    check(r.returncode == 0, f"train --log-dir: {r.stderr.strip()}")
    check("eval at step 2: val loss" in r.stderr and "tokens/s" in r.stderr,
          f"progress lines: {r.stderr[-300:]}")
    lines = [json.loads(l) for l in open(os.path.join(logs, "metrics.jsonl"))]
    steps = [l for l in lines if "loss" in l]
    evals = [l for l in lines if "val_loss" in l]
    check(len(steps) == 5 and [e["step"] for e in evals] == [2, 4, 5],
          f"metrics.jsonl: {len(steps)} steps, evals at {[e['step'] for e in evals]}")
    check(all(set(s) >= {"step", "loss", "lr", "grad_norm", "seconds", "samples_per_s",
                         "tokens_per_s", "data_wait_s"} for s in steps), "metrics step fields")
    svg = ET.parse(os.path.join(logs, "loss.svg")).getroot()
    ids = {e.get("id") for e in svg.iter() if e.tag.endswith("polyline")}
    check(ids == {"train", "val"}, f"loss.svg curves {ids}")
    for e in svg.iter():
        if e.tag.endswith("polyline") and e.get("id") == "val":
            check(len(e.get("points").split()) == 3, "loss.svg's val curve has 3 points")


def test_errors():
    if mpirun:
        return
    d = os.path.join(tmp, "errors")
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "ok.npy"), np.arange(100, dtype=np.int32) % 7)
    np.save(os.path.join(d, "two_d.npy"), np.zeros((4, 4), dtype=np.int32))
    np.save(os.path.join(d, "float.npy"), np.zeros(10, dtype=np.float32))
    np.save(os.path.join(d, "x10.npy"), np.zeros((10, 2), dtype=np.float32))
    np.save(os.path.join(d, "y9.npy"), np.zeros(9, dtype=np.int64))
    np.save(os.path.join(d, "ids.npy"), np.zeros((2, 4), dtype=np.int64))
    write_bin(os.path.join(d, "bad.bin"), [1, 2, 3])
    with open(os.path.join(d, "bad.bin"), "r+b") as f:
        f.write(np.int32(7).tobytes())
    base = {"meshes": {"m": "2"},
            "tensors": {"t": {"shape": [2, 4], "dtype": "int64", "input": {"data": "window"},
                              "mesh": "m", "placements": ["S(0)"]},
                        "tab": {"shape": [8, 2], "weight": {"normal": 0.1, "seed": 1},
                                "mesh": "m", "placements": ["R"]}},
            "nodes": [{"name": "e", "op": "embedding", "inputs": ["t", "tab"]},
                      {"name": "loss", "op": "mean", "inputs": ["e"], "dims": [0, 1, 2]}],
            "loss": "loss", "outputs": ["loss"]}
    cases = [
        ("missing", {"train": "nope.npy"}, None, "nope.npy"),
        ("two_d", {"train": "two_d.npy"}, None, "a token stream is 1-d"),
        ("float", {"train": "float.npy"}, None, "unsupported dtype descr '<f4'"),
        ("bin", {"train": "bad.bin"}, None, "magic 7, expected 20240520"),
        ("empty", {"train": "ok.npy"}, lambda m: m["tensors"]["t"].update(shape=[2, 200]),
         "the train split has no unit"),
        ("arraysN", {"train": {"x": "x10.npy", "y": "y9.npy"}}, None,
         "sample arrays of different N"),
        ("noinput", {"train": "ok.npy"},
         lambda m: m["tensors"]["t"].update(input="ids.npy"), "no tensor reads it"),
        ("name", {"train": "ok.npy"},
         lambda m: m["tensors"]["t"].update(input={"data": "windows"}), "read it as \"window\""),
        ("notint", {"train": "ok.npy"},
         lambda m: m["tensors"]["t"].update(dtype="float32"), "int32 or int64"),
        ("batch", {"train": "ok.npy"}, lambda m: m["tensors"]["t"].update(batch=False),
         "cannot be set on a data input"),
        ("shift", {"train": {"x": "x10.npy"}},
         lambda m: (m["tensors"]["t"].update(input={"data": "x", "shift": 1}, shape=[2, 2],
                                            dtype="float32"),
                    m.update(nodes=[{"name": "loss", "op": "mean", "inputs": ["t"],
                                     "dims": [0, 1]}])),
         "\"shift\" applies to token streams only"),
        ("random", {"train": {"x": "x10.npy"}, "order": "random"}, None,
         "\"random\" applies to token streams only"),
        ("seed", {"train": "ok.npy", "seed": 2**32}, None, "seed"),
        ("batches", {"train": "ok.npy"},
         lambda m: m["tensors"].update(u={"shape": [3, 4], "dtype": "int64",
                                          "input": {"data": "window", "shift": 1},
                                          "mesh": "m", "placements": ["R"]}),
         "data inputs share one batch size B"),
        ("trailing", {"train": {"x": "x10.npy"}},
         lambda m: (m["tensors"]["t"].update(input={"data": "x"}, shape=[2, 3],
                                             dtype="float32"),
                    m.update(nodes=[{"name": "loss", "op": "mean", "inputs": ["t"],
                                     "dims": [0, 1]}])),
         "holds samples of float32 [2] but the input's are float32 [3]"),
        ("unknown", {"train": {"x": "x10.npy"}},
         lambda m: (m["tensors"]["t"].update(input={"data": "z"}, shape=[2, 2],
                                             dtype="float32"),
                    m.update(nodes=[{"name": "loss", "op": "mean", "inputs": ["t"],
                                     "dims": [0, 1]}])),
         "reads array \"z\", which the data lacks (it has: x)"),
        ("nodata", None, lambda m: m["tensors"]["t"].update(input={"data": "window"}),
         "the model has no \"data\" object"),
    ]
    for label, data, edit, needle in cases:
        m = json.loads(json.dumps(base))
        if data is not None:
            m["data"] = data
        if edit:
            edit(m)
        path = os.path.join(d, f"{label}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        r = run("train", path, "--steps", "1")
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and needle in r.stderr and "step 1/" not in r.stderr,
              f"error {label}: rc {r.returncode}: {r.stderr.strip()}")
    m = json.loads(json.dumps(base))
    m["data"] = {"train": "ok.npy"}
    path = os.path.join(d, "noval.json")
    with open(path, "w") as f:
        json.dump(m, f)
    r = run("train", path, "--eval-every", "1")
    check(r.returncode == 1 and "--eval-every 1: the model has no val split" in r.stderr,
          f"eval without val: {r.stderr.strip()}")


def test_bad_id_stops_at_its_step():
    d = os.path.join(tmp, "badid")
    os.makedirs(d, exist_ok=True)
    t = (np.arange(2000) % 32).astype(np.uint16)
    t[500] = 40
    np.save(os.path.join(d, "train.npy"), t)
    np.save(os.path.join(d, "val.npy"), t[:100])
    subprocess.run(["/usr/bin/python3", make_gpt, d, "--data", d, "--order", "sequential"],
                   check=True)
    r = run("train", os.path.join(d, "gpt_tp.json"), "--steps", "20", ranks=4 if mpirun else None,
            timeout=120)
    # Under mpirun, Open MPI's own abort lines may come first.
    errors = [l for l in r.stderr.splitlines() if l.startswith("meshflow: error:")]
    check(r.returncode == 1 and errors and "step 16: " in errors[0] and "device " in errors[0]
          and "id 40" in errors[0], f"bad id: rc {r.returncode}: {errors}")


def rss_of(*args):
    """Runs meshflow ARGS; returns (its JSON, the process's maximum resident set in bytes)."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], "
            "capture_output=True, text=True); sys.stdout.write(r.stdout); "
            "sys.stderr.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
            " if r.returncode == 0 else r.stderr)")
    r = subprocess.run(["/usr/bin/python3", "-c", code, meshflow, *args], capture_output=True,
                       text=True, timeout=600)
    if not r.stdout:
        check(False, f"{args}: {r.stderr.strip()[-300:]}")
        return None, 0
    return json.loads(r.stdout), int(r.stderr)


def test_large_stream_memory():
    if mpirun:
        return
    d = os.path.join(tmp, "big")
    os.makedirs(d, exist_ok=True)
    # 2 GiB of uint16 tokens, sparse: its pages hold zeros nobody wrote.
    big = np.lib.format.open_memmap(os.path.join(d, "big.npy"), mode="w+", dtype=np.uint16,
                                    shape=(1 << 30,))
    big[::1 << 20] = np.arange(1 << 10) % 32
    del big
    np.save(os.path.join(d, "small.npy"), (np.arange(1 << 19) % 32).astype(np.uint16))
    for order in ("sequential", "random", "shuffled"):
        peaks = {}
        for name in ("small", "big"):
            out = os.path.join(d, f"{name}_{order}")
            os.makedirs(out, exist_ok=True)
            for split, src in (("train", name), ("val", "small")):
                if not os.path.exists(os.path.join(out, f"{split}.npy")):
                    os.link(os.path.join(d, f"{src}.npy"), os.path.join(out, f"{split}.npy"))
            subprocess.run(["/usr/bin/python3", make_gpt, out, "--data", out, "--order", order,
                            "--seq", "512"], check=True)
            model = os.path.join(out, "gpt_dp.json")
            j, rss = rss_of("train", model, "--steps", "20", "--json")
            e = run("explain", model, "--json")
            if j and e.returncode == 0:
                peaks[name] = (j["measured_peak_bytes"], rss,
                               json.loads(e.stdout)["memory_per_device_bytes"])
        if len(peaks) != 2:
            continue
        (ms, rs, es), (mb, rb, eb) = peaks["small"], peaks["big"]
        # The shuffled order keeps its permutation: 4 bytes a unit of 512 tokens.
        perm = 4 * ((1 << 30) - 1) // 512 - 4 * ((1 << 19) - 1) // 512 \
            if order == "shuffled" else 0
        check(abs(mb - ms) < 64 << 20 and rb - rs < (64 << 20) + perm,
              f"{order}: 2 GiB stream peak {mb} / rss {rb} against 1 MiB {ms} / {rs}")
        check(abs((eb - es) - perm) <= 8, f"{order}: the estimate grows by {eb - es}, not {perm}")


test_orders()
test_train_equals_one_device()
test_same_batches_on_every_mesh()
test_resume()
test_generator_over_data()
test_metrics()
test_errors()
test_bad_id_stops_at_its_step()
test_large_stream_memory()
finish()
