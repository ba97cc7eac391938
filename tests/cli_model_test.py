"""`meshflow run`, `train` and `explain` on the example models, on threads and (with --mpi
MPIRUN) under mpirun -n 4: every example trains to the one-device result, the JSON outputs have
DESIGN.md's form, saved folders gather to NumPy's forward pass, and every bad model file gives
one line naming the culprit, exit status 1 and no output folder.
Usage: cli_model_test.py MESHFLOW EXAMPLES_DIR [--mpi MPIRUN]"""
import json
import subprocess
import os
import shutil
import sys
import tempfile

import numpy as np

from checks import check, finish, run_meshflow
from philox import philox

meshflow, examples = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
TOLERANCE = 1e-5  # float32 rounding of sums in another order


def run(*args, ranks=None):
    return run_meshflow(meshflow, args, mpirun, ranks, timeout=300)


def initialiser(spec, shape):
    """DESIGN.md's seeded initialisers, in NumPy."""
    n = int(np.prod(shape))
    if "zeros" in spec:
        return np.zeros(shape)
    w0, w1 = philox(np.arange(n, dtype=np.uint64), spec["seed"])
    a = (w0 >> np.uint64(8)).astype(np.float64) / 2**24
    b = (w1 >> np.uint64(8)).astype(np.float64) / 2**24
    if "uniform" in spec:
        lo, hi = spec["uniform"]
        v = lo + (hi - lo) * a
    else:
        v = spec["normal"] * np.sqrt(-2 * np.log(1 - a)) * np.cos(2 * np.pi * b)
    return v.astype(np.float32).astype(np.float64).reshape(shape)


def model(name):
    return os.path.join(examples, name + ".json")


ALL = ["dp_mlp", "tp_mlp", "dp_tp_mlp", "tp_sp_mlp", "dp_tp_sp_mlp", "pipeline_mlp",
       "ff_repartition_relu", "ff_repartition_combine_relu", "ff_repartition_linear_reduction_relu",
       "tp_attention_block"]
trained = ["tp_mlp", "dp_tp_mlp", "pipeline_mlp", "tp_attention_block"] if mpirun else ALL
# --overlap: every example, where the cost model keeps these small collectives whole; and the
# sequence-parallel TP and DP x TP examples with every all-gather and reduce-scatter decomposed
# around its product, a gather form being named.
runs = [(name, []) for name in trained] + [
    (name, ["--overlap"]) for name in (["tp_sp_mlp", "dp_tp_sp_mlp"] if mpirun else ALL)] + [
    (name, ["--overlap", "--gather-form", form]) for name in ["tp_sp_mlp", "dp_tp_sp_mlp"]
    for form in ["permute", "broadcast"] + ([] if mpirun else ["in_place"])]
# The optimizers: AdamW with clipping that bites and warmup, SGD with momentum and linear decay.
ADAMW_WEIGHT_TOLERANCE = 1e-2 * 0.01  # a hundredth of the learning rate
ADAMW = ["--optimizer", "adamw", "--lr", "0.01", "--clip-grad-norm", "0.1", "--warmup-steps", "1"]
MOMENTUM = ["--momentum", "0.9", "--decay", "linear", "--decay-steps", "4"]
runs += [(name, options) for name in ["tp_mlp", "dp_tp_mlp", "pipeline_mlp"]
         for options in [ADAMW, MOMENTUM]]
# Micro-batches: the gradient accumulated over 2 or 4 of them equals the full batch's.
runs += [(name, ["--micro-batches", m]) for name in ["tp_mlp", "dp_tp_mlp", "pipeline_mlp",
                                                      "tp_attention_block"] for m in ["2", "4"]]
for name, extra in runs:
    r = run("train", model(name), "--steps", "3", "--check", "--json", *extra,
            ranks=4 if mpirun else None)
    check(r.returncode == 0, f"train {name}: {r.stderr}")
    if r.returncode != 0:
        continue
    out = json.loads(r.stdout)
    check([s["step"] for s in out["steps"]] == [1, 2, 3], f"{name} steps {out['steps']}")
    check(out["steps"][2]["loss"] < out["steps"][0]["loss"], f"{name}: the loss falls")
    for key in ["max_loss_diff", "max_weight_diff", "max_grad_diff"]:
        # AdamW divides by sqrt(v): where a gradient element is near zero, float32 sums in
        # another order change its update by up to a fraction of lr (measured: 2.7e-5 at lr
        # 0.01 on pipeline_mlp, 2e-14 in float64 models).
        tolerance = ADAMW_WEIGHT_TOLERANCE if extra is ADAMW and key == "max_weight_diff" else TOLERANCE
        check(out["check"][key] <= tolerance, f"{name} {extra} {key} = {out['check'][key]}")
    check("step 3/3" in r.stderr and "steps/s" in r.stderr, f"{name} progress: {r.stderr!r}")
    if mpirun:
        check(r.stdout.count('"steps"') == 1, f"{name}: only device 0 prints")

# Every command prints once, under mpirun too: explain's JSON, a benchmark's table.
r = run("explain", model("dp_tp_mlp"), "--json", "--optimizer", "adamw", ranks=4 if mpirun else None)
check(r.returncode == 0 and r.stdout.count('"values"') == 1, f"explain prints once: {r.stdout[:200]}")
if r.returncode == 0:
    values = json.loads(r.stdout)["values"]
    check(values.get("w1.exp_avg") == values["w1"] and values.get("w2.exp_avg_sq") == values["w2"],
          f"adamw's state has its weight's layout: {values}")
# calibrate writes a description that explain --machine reads, and its estimates are its own.
with tempfile.TemporaryDirectory() as tmp:
    out = f"{tmp}/machine.json"
    r = run("calibrate", "--reps", "1", "--out", out, *(() if mpirun else ("--devices", "2")),
            ranks=2 if mpirun else None)
    progress = [l for l in r.stderr.splitlines() if l.startswith("calibrate: ")]
    check(r.returncode == 0 and r.stdout.count("wrote ") == 1, f"calibrate: {r.returncode} {r.stdout!r} {r.stderr[-300:]!r}")
    check(len(progress) >= 20 and all("calibrate: " in l for l in r.stderr.splitlines()),
          f"calibrate: a progress line per measurement: {r.stderr[-300:]!r}")
    if r.returncode == 0:
        machine = json.load(open(out))
        link = machine["links"][machine["default_link"]]
        check(machine["default_link"] == ("mpi" if mpirun else "shared_memory") and link["bandwidth_gbps"] > 0
              and machine["gemm_gflops"] > 0 and machine["elementwise_gbps"] > 0, f"calibrated: {machine}")
        given = json.loads(run("explain", model("dp_tp_mlp"), "--json", "--machine",
                               "default").stdout)["est_step_s"]
        own = run("explain", model("dp_tp_mlp"), "--json", "--machine", out)
        check(own.returncode == 0 and json.loads(own.stdout)["est_step_s"] != given,
              f"explain --machine prices with the calibrated description: {given} {own.stdout[:200]}")
        del machine["gemm_gflops"], machine["memcpy_gbps"]
        with open(out, "w") as f:
            json.dump(machine, f)
        bad = run("explain", model("dp_tp_mlp"), "--machine", out)
        check(bad.returncode == 1 and bad.stderr.count("\n") == 1 and '"memcpy_gbps"' in bad.stderr,
              f"an incomplete description: one line naming the field: {bad.stderr!r}")

# Without --machine, explain prices with this machine's description: measured the first time
# into the cache folder (one progress line says so), read after without measuring, measured
# again for another key (threads per device) and over a corrupt file (one line naming it);
# --machine default and --machine FILE never touch the cache. A 2-device copy of dp_mlp keeps
# each measurement short.
with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as tmp:
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = cache
    try:
        two = json.load(open(model("dp_mlp")))
        two["meshes"]["dp"] = "2"
        for t in two["tensors"].values():
            if "input" in t:
                t["input"] = os.path.join(examples, t["input"])
        path = f"{tmp}/dp2.json"
        with open(path, "w") as f:
            json.dump(two, f)
        folder = f"{cache}/meshflow"
        files = lambda: sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        measured = lambda r: r.stderr.count("measuring this machine for the cost model")
        ranks = 2 if mpirun else None
        est = lambda r: json.loads(r.stdout)["est_step_s"] if r.returncode == 0 else None

        first = run("explain", path, "--json", ranks=ranks)
        check(first.returncode == 0 and measured(first) == 1 and len(files()) == 1,
              f"a first explain measures and writes the cache: {files()} {first.stderr[-400:]!r}")
        second = run("explain", path, "--json", ranks=ranks)
        check(second.returncode == 0 and measured(second) == 0 and second.stderr == "" and
              est(second) == est(first), f"a second explain reads it: {second.stderr[-300:]!r}")
        builtin = run("explain", path, "--json", "--machine", "default", ranks=ranks)
        check(builtin.returncode == 0 and est(builtin) != est(first),
              f"the measured description prices unlike the built-in one: {est(builtin)} {est(first)}")
        other = run("explain", path, "--json", "--threads-per-device", "2", ranks=ranks)
        check(other.returncode == 0 and measured(other) == 1 and len(files()) == 2,
              f"another key is measured again: {files()} {other.stderr[-300:]!r}")
        with open(f"{folder}/{files()[0]}", "w") as f:
            f.write('{"version": 1, "key": ')
        corrupt = run("explain", path, "--json", ranks=ranks)
        lines = [l for l in corrupt.stderr.splitlines() if files()[0] in l and "again" in l]
        check(corrupt.returncode == 0 and measured(corrupt) == 1 and len(lines) == 1,
              f"a corrupt cache file is measured over, with one line: {corrupt.stderr[-400:]!r}")
        rewritten = json.load(open(f"{folder}/{files()[0]}"))
        check(rewritten["version"] == json.load(open(f"{folder}/{files()[1]}"))["version"] and
              "machine" in rewritten, "the corrupt file is written over")
        with open(f"{tmp}/m.json", "w") as f:  # the measured description, as a file
            json.dump(json.load(open(f"{folder}/{files()[0]}"))["machine"], f)
        shutil.rmtree(folder)
        for machine in ["default", f"{tmp}/m.json"]:
            r = run("explain", path, "--json", "--machine", machine, ranks=ranks)
            check(r.returncode == 0 and measured(r) == 0 and not os.path.exists(folder),
                  f"--machine {machine} never touches the cache: {r.returncode} {r.stderr[-200:]!r}")
    finally:
        if saved is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = saved

if mpirun:
    b = subprocess.run([mpirun, "--oversubscribe", "--allow-run-as-root", "-n", "2", meshflow,
                        "bench", "copy", "--mib", "1", "--reps", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    check(b.returncode == 0 and b.stdout.count('"benchmark"') == 1, f"bench copy prints once: {b.stdout}")

with tempfile.TemporaryDirectory() as tmp:
    # A step whose loss is not finite: exit 1, one line naming the step (once under mpirun),
    # no --save folder; --allow-nonfinite trains on and reports the loss as null.
    ranks = 4 if mpirun else None
    r = run("train", model("tp_mlp"), "--lr", "1e30", "--steps", "3", "--save", f"{tmp}/w", ranks=ranks)
    errors = [l for l in r.stderr.splitlines() if l.startswith("meshflow: error")]
    check(r.returncode == 1 and errors == ["meshflow: error: step 2: the loss is not finite; training "
                                           "stopped before its update and wrote nothing "
                                           "(--allow-nonfinite trains on)"], f"nan loss: {r.stderr}")
    check(not os.path.exists(f"{tmp}/w"), "a stopped run wrote its --save folder")
    r = run("train", model("tp_mlp"), "--lr", "1e30", "--steps", "3", "--allow-nonfinite", "--json",
            ranks=ranks)
    check(r.returncode == 0, f"--allow-nonfinite: {r.stderr}")
    if r.returncode == 0:
        losses = [s["loss"] for s in json.loads(r.stdout)["steps"]]
        check(losses[0] is not None and losses[1] is None and losses[2] is None, f"losses {losses}")

    # The model file's "train" object gives defaults; the command line wins.
    spec = json.load(open(model("tp_mlp")))
    spec["train"] = {"optimizer": "adamw", "lr": 0.02, "clip_grad_norm": 0.5}
    for t in spec["tensors"].values():
        for field in ["input", "weight"]:
            if isinstance(t.get(field), str):
                t[field] = os.path.join(os.path.abspath(examples), t[field])
    with open(f"{tmp}/adamw.json", "w") as f:
        json.dump(spec, f)
    r = run("explain", f"{tmp}/adamw.json", "--json", ranks=ranks)
    check(r.returncode == 0 and "w1.exp_avg" in json.loads(r.stdout or "{}").get("values", {}),
          f"the file's optimizer: {r.stderr}")
    r = run("train", f"{tmp}/adamw.json", "--steps", "2", "--check", "--json", "--lr", "0.01", ranks=ranks)
    check(r.returncode == 0 and json.loads(r.stdout)["check"]["max_weight_diff"] <= TOLERANCE,
          f"train with the file's optimizer: {r.stderr}")
    r = run("train", f"{tmp}/adamw.json", "--optimizer", "sgd", ranks=ranks)
    check(r.returncode == 0, f"--optimizer sgd over the file's adamw (its lr and clipping apply): {r.stderr}")
    spec["train"]["micro_batches"] = 3  # 64 rows do not split into 3: the file's M is used
    with open(f"{tmp}/adamw.json", "w") as f:
        json.dump(spec, f)
    r = run("train", f"{tmp}/adamw.json", ranks=ranks)
    check(r.returncode == 1 and "does not split into 3 micro-batches" in r.stderr,
          f"the file's micro_batches: {r.stderr}")
    r = run("train", f"{tmp}/adamw.json", "--micro-batches", "2", ranks=ranks)
    check(r.returncode == 0, f"--micro-batches over the file's: {r.stderr}")
    del spec["train"]["micro_batches"]
    # The file's ZeRO level (of tp_mlp's weights only the replicated bias b2 has a ZeRO dim:
    # FSDP shards it and gathers it for its use); --zero on the command line wins; a level that
    # is none is one line naming the option.
    spec["train"]["zero"] = 3
    with open(f"{tmp}/adamw.json", "w") as f:
        json.dump(spec, f)
    r = run("explain", f"{tmp}/adamw.json", "--json", ranks=ranks)
    gathers = [m for m in json.loads(r.stdout or '{"moves": []}')["moves"] if "freed_after" in m]
    check(r.returncode == 0 and gathers, f"the file's zero: {r.stderr}")
    r = run("explain", f"{tmp}/adamw.json", "--json", "--zero", "0", ranks=ranks)
    gathers = [m for m in json.loads(r.stdout or '{"moves": []}')["moves"] if "freed_after" in m]
    check(r.returncode == 0 and not gathers, f"--zero 0 over the file's: {r.stderr}")
    r = run("train", f"{tmp}/adamw.json", "--zero", "2", ranks=ranks)
    check(r.returncode == 1 and r.stderr.count("meshflow: error: --zero 2: must be 0, 1 or 3") == 1,
          f"--zero 2: {r.stderr}")
    del spec["train"]["zero"]
    spec["train"]["eps"] = 1e-6
    with open(f"{tmp}/adamw.json", "w") as f:
        json.dump(spec, f)
    r = run("train", f"{tmp}/adamw.json", "--optimizer", "sgd", ranks=ranks)
    check(r.returncode == 1 and r.stderr.count("meshflow: error: --eps is not an option of --optimizer sgd") == 1,
          f"the file's adamw option with sgd: {r.stderr}")

with tempfile.TemporaryDirectory() as tmp:
    # run --save: each output gathers to NumPy's own forward pass of the data-parallel MLP.
    ranks = 4 if mpirun else None
    r = run("run", model("dp_mlp"), "--save", f"{tmp}/out", "--json", "--trace", f"{tmp}/t.json",
            ranks=ranks)
    check(r.returncode == 0, f"run: {r.stderr}")
    if r.returncode == 0:
        out = json.loads(r.stdout)["outputs"]
        check(out["o"] == {"mesh": "4@0,1,2,3", "placements": ["S(0)"], "shape": [64, 10]}, f"{out}")
        check(out["loss"]["shape"] == [], f"{out}")
        g = run("gather", "--in", f"{tmp}/out/o", "--out", f"{tmp}/o.npy")
        check(g.returncode == 0, g.stderr)
        # NumPy's own forward pass, the weights drawn by DESIGN.md's initialiser rule.
        spec = json.load(open(model("dp_mlp")))["tensors"]
        x = np.load(os.path.join(examples, "x.npy")).astype(np.float64)
        w = {k: initialiser(spec[k]["weight"], spec[k]["shape"]) for k in ["w1", "b1", "w2", "b2"]}
        want = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
        o = np.load(f"{tmp}/o.npy")
        check(np.allclose(o, want, rtol=1e-4, atol=1e-5), f"saved o differs from NumPy by {np.abs(o - want).max()}")
        trace = json.load(open(f"{tmp}/t.json"))
        tracks = {e["pid"] for e in trace["traceEvents"] if e["ph"] == "M"}
        check(tracks == {0, 1, 2, 3}, f"trace tracks {tracks}")

    # run --overlap --trace: each device's transfers (its second track) overlap its products
    # (3 permutes of the gather into h, 3 of the reduce-scatter of o).
    r = run("run", model("tp_sp_mlp"), "--overlap", "--gather-form", "permute", "--trace",
            f"{tmp}/o.json", ranks=ranks)
    check(r.returncode == 0, f"run --overlap: {r.stderr}")
    if r.returncode == 0:
        events = [e for e in json.load(open(f"{tmp}/o.json"))["traceEvents"] if e["ph"] == "X"]
        for d in range(4):
            transfers = [e for e in events if e["pid"] == d and e["cat"] == "transfer"]
            products = [e for e in events if e["pid"] == d and e["cat"] == "product"]
            check(len(transfers) == 6 and {e["tid"] for e in transfers} == {1},
                  f"device {d}: transfers {transfers}")
            hidden = [p for p in products for t in transfers
                      if t["ts"] <= p["ts"] and p["ts"] + p["dur"] <= t["ts"] + t["dur"]]
            check(len(hidden) >= 4, f"device {d}: products inside transfers {hidden}")

    # explain --overlap --json: the example's blocks are far too small for a loop to pay (on the
    # built-in description), so the cost model keeps each collective whole and says why.
    r = run("explain", model("tp_sp_mlp"), "--overlap", "--json", "--machine", "default")
    check(r.returncode == 0, r.stderr)
    moves = json.loads(r.stdout)["moves"]
    kept = [(m["value"], m["steps"]) for m in moves if "kept_whole" in m]
    check(kept == [("t", ["all_gather"]), ("o", ["reduce_scatter"]), ("grad:o", ["all_gather"]),
                   ("grad:t", ["reduce_scatter"])] and
          all(m["kept_whole"]["loop_s"] >= m["kept_whole"]["sequential_s"]
              for m in moves if "kept_whole" in m) and
          not any("overlapped_with" in m for m in moves), f"{moves}")
    # Naming a form decomposes every one: an all-gather is n - 1 permutes beside its product
    # (or read in place on threads, where devices share memory); a reduce-scatter is n - 1
    # permutes.
    for backend, form, gather in [("mpi", "permute", ["permute"] * 3),
                                  ("threads", "in_place", ["in_place"])]:
        r = run("explain", model("tp_sp_mlp"), "--overlap", "--backend", backend,
                "--gather-form", form, "--json")
        check(r.returncode == 0, r.stderr)
        decomposed = [m for m in json.loads(r.stdout)["moves"] if "overlapped_with" in m]
        check([(m["value"], m["overlapped_with"], m["steps"]) for m in decomposed] ==
              [("t", "h", gather), ("o", "o:kernel", ["permute"] * 3),
               ("grad:o", "bwd:o/0", gather), ("grad:t", "bwd:h/0", ["permute"] * 3)],
              f"{backend}: {decomposed}")
    r = run("explain", model("tp_sp_mlp"), "--overlap", "--backend", "mpi", "--gather-form",
            "in_place")
    check(r.returncode != 0 and r.stderr.count("\n") == 1 and
          "gather form in_place reads peers' blocks where they lie" in r.stderr, r.stderr)

    # explain --json: DESIGN's form; the DP×TP MLP's moves are the reduction and the gradients.
    r = run("explain", model("dp_tp_mlp"), "--json")
    check(r.returncode == 0, r.stderr)
    e = json.loads(r.stdout)
    check(e["values"]["h"] == {"mesh": "2x2@0,1,2,3", "placements": ["S(0)", "S(1)"]}, f"{e['values']}")
    moves = {(m["value"], m["consumer"], m["pass"]) for m in e["moves"]}
    check(("o", "r", "forward") in moves, f"{moves}")
    for w in ["w1", "w2", "b2"]:
        check((f"grad:{w}", f"sgd:{w}", "update") in moves, f"{w}: {moves}")
    for m in e["moves"]:
        check(m["steps"] and "local" not in m["steps"], f"{m}")
        check(set(m) >= {"value", "consumer", "pass", "from", "to", "steps"}, f"{m}")
    r = run("explain", model("dp_mlp"), "--json")
    forward = [m for m in json.loads(r.stdout)["moves"] if m["pass"] != "update"]
    check(forward == [], f"data parallelism moves nothing but gradients: {forward}")

    if not mpirun:
        # Bad model files: one line naming the node or tensor, exit 1, no output folder.
        for data in ["x.npy", "y.npy"]:
            shutil.copy(os.path.join(examples, data), tmp)
        base = json.load(open(model("dp_mlp")))

        def variant(edit):
            m = json.loads(json.dumps(base))
            edit(m)
            return m

        def node(name):
            return lambda m: next(n for n in m["nodes"] if n["name"] == name)

        cases = [
            ("not JSON", "{\"meshes\": ", "invalid JSON"),
            ("unknown op", variant(lambda m: node("a")(m).update(op="frobnicate")),
             "node \"a\" has unknown op \"frobnicate\""),
            ("dangling name", variant(lambda m: node("o")(m).update(inputs=["a", "w9"])),
             "node \"o\" reads \"w9\""),
            ("duplicate name", variant(lambda m: node("a")(m).update(name="h")),
             "name \"h\" is given to two values"),
            ("unknown mesh", variant(lambda m: m["tensors"]["w1"].update(mesh="tp")),
             "names mesh \"tp\""),
            ("wrong placement count", variant(lambda m: m["tensors"]["w1"].update(placements=["R", "R"])),
             "tensor \"w1\": mesh 4 has 1 dims but placements \"R,R\" give 2"),
            ("shapes that do not fit", variant(lambda m: m["tensors"]["w2"].update(shape=[63, 10])),
             "node \"o\""),
            ("degree that does not fit", variant(lambda m: m["nodes"].insert(3, {
                "name": "c", "op": "combine", "inputs": ["o"], "dim": 0, "degree": 2,
                "placements": ["R"]})), "node \"c\": combine degree 2 does not fit"),
            ("loss not a scalar", variant(lambda m: m.update(loss="o")), "the loss \"o\" is float32 64x10"),
            ("missing data", variant(lambda m: m["tensors"]["x"].update(input="nope.npy")),
             "tensor \"x\": cannot open"),
            ("data of another shape", variant(lambda m: m["tensors"]["x"].update(shape=[64, 31])),
             "tensor \"x\": "),
        ]
        for what, text, message in cases:
            path = f"{tmp}/bad.json"
            with open(path, "w") as f:
                f.write(text if isinstance(text, str) else json.dumps(text))
            for cmd in (["train", path, "--save", f"{tmp}/saved"], ["run", path, "--save", f"{tmp}/saved"],
                        ["explain", path]):
                r = run(*cmd)
                lines = r.stderr.strip().splitlines()
                check(r.returncode == 1, f"{what} ({cmd[0]}): exit {r.returncode}: {r.stderr}")
                check(len(lines) == 1 and message in lines[0], f"{what} ({cmd[0]}): {r.stderr!r}")
                check(not os.path.exists(f"{tmp}/saved"), f"{what}: an output folder appeared")

finish()
