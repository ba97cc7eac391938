"""The GPT example (examples/models/gpt): make_gpt.py writes exactly the files checked in; every
layout trains 3 steps equal to one device (--check), with SGD and with AdamW, clipping, warmup
and cosine decay, in one and in two micro-batches, on threads, and the TP and DP x TP layouts under mpirun -n 4 (and a wide-vocabulary tp_vocab, whose loss runs vocabulary-parallel, on
both, also laid on a 4x1 mesh); every layout's losses are the one-device losses; the sequence-parallel layout
moves, per block forward, two all-gathers into the products and two reduce-scatters out of them,
and nothing else but its embedding's reduce-scatter and its logits' gathers; with a vocabulary
wide enough the loss runs vocabulary-parallel, moving only per-row statistics; --zero 1 and 3
train as --zero 0 does, and FSDP holds less; --recompute selective and full train bit for bit
as none (the TP, DP x TP and pipeline layouts under mpirun -n 4).
Usage: cli_gpt_test.py MESHFLOW GPT_DIR [--mpi MPIRUN]"""
import filecmp
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from checks import check, finish, run_meshflow

meshflow, gpt = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
TOLERANCE = 1e-5  # float32 rounding of sums in another order
LAYOUTS = ["one", "dp", "tp", "tp_vocab", "sp", "dp_tp"]


def model(layout):
    return os.path.join(gpt, f"gpt_{layout}.json")


def train_checked(args, what):
    """Runs `meshflow train ARGS --check --json` (4 ranks under mpirun); checks that it exits 0
    and equals one device within TOLERANCE. Returns its JSON output, or None when it failed."""
    r = run_meshflow(meshflow, ["train", *args, "--check", "--json"], mpirun,
                     4 if mpirun else None, timeout=300)
    check(r.returncode == 0, f"train {what}: {r.stderr}")
    if r.returncode != 0:
        return None
    out = json.loads(r.stdout)
    for key in ["max_loss_diff", "max_weight_diff", "max_grad_diff"]:
        check(out["check"][key] <= TOLERANCE, f"{what} {key} = {out['check'][key]}")
    return out


if not mpirun:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["/usr/bin/python3", os.path.join(gpt, "make_gpt.py"), tmp], check=True)
        written = sorted(os.listdir(tmp))
        check(written == sorted(f for f in os.listdir(gpt) if f != "make_gpt.py" and
                                f != "README.md"), f"make_gpt.py writes {written}")
        for f in written:
            # The dataset is a folder (data/train.npy, data/val.npy).
            files = [os.path.join(f, g) for g in sorted(os.listdir(os.path.join(tmp, f)))] \
                if os.path.isdir(os.path.join(tmp, f)) else [f]
            for g in files:
                check(filecmp.cmp(os.path.join(tmp, g), os.path.join(gpt, g), shallow=False),
                      f"{g} is not what make_gpt.py writes")

# Plain SGD, and AdamW with clipping (tight enough to bite), warmup and cosine decay.
OPTIMIZERS = {"sgd": [],
              "adamw": ["--optimizer", "adamw", "--lr", "0.003", "--clip-grad-norm", "0.5",
                        "--warmup-steps", "1", "--decay", "cosine", "--decay-steps", "3"]}
# Each also in 2 micro-batches: equal to the full batch (and to one device).
reference = {}  # per optimizer, each layout's losses in one micro-batch
for (optimizer, options), micro in [(o, m) for o in OPTIMIZERS.items() for m in (1, 2)]:
    losses = {}
    for layout in (["tp", "dp_tp"] if mpirun else LAYOUTS):
        out = train_checked([model(layout), "--steps", "3", "--micro-batches", str(micro),
                             *options], f"{layout} {optimizer}")
        if out is None:
            continue
        losses[layout] = [s["loss"] for s in out["steps"]]
        check(losses[layout][2] < losses[layout][0],
              f"{layout} {optimizer}: the loss falls {losses[layout]}")
    if micro == 1:
        full_batch = losses
        reference[optimizer] = losses
    for layout, l in losses.items():
        want = full_batch.get("one", full_batch.get(layout))
        check(max(abs(a - b) for a, b in zip(l, want)) <= TOLERANCE,
              f"{layout} {optimizer} in {micro} micro-batches: losses {l} against {want}")

# ZeRO-1 and FSDP train as --zero 0 does (and as one device), in one and two micro-batches,
# with AdamW and clipping, and with SGD and momentum; their memory estimate is what the runtime
# holds, and FSDP holds less than --zero 0.
ZERO_OPTIMIZERS = {"adamw": OPTIMIZERS["adamw"], "momentum": ["--momentum", "0.9"]}
for zero, micro, optimizer in [(z, m, o) for z in ("1", "3") for m in ("1", "2")
                               for o in ZERO_OPTIMIZERS]:
    for layout in (["dp_tp"] if mpirun else ["dp", "sp", "dp_tp"]):
        what = f"{layout} --zero {zero} {optimizer} M={micro}"
        out = train_checked([model(layout), "--steps", "3", "--zero", zero, "--micro-batches",
                             micro, *ZERO_OPTIMIZERS[optimizer]], what)
        if out is None:
            continue
        if optimizer in reference and layout in reference[optimizer]:
            want = reference[optimizer][layout]
            got = [s["loss"] for s in out["steps"]]
            check(max(abs(a - b) for a, b in zip(got, want)) <= TOLERANCE,
                  f"{what}: losses {got} against --zero 0's {want}")
peaks = {}
for zero in ("0", "3"):
    layout = "dp_tp" if mpirun else "dp"
    options = ["--optimizer", "adamw", "--zero", zero]
    e = run_meshflow(meshflow, ["explain", model(layout), "--json", *options], mpirun,
                     4 if mpirun else None, timeout=300)
    t = run_meshflow(meshflow, ["train", model(layout), "--json", "--steps", "1", *options],
                     mpirun, 4 if mpirun else None, timeout=300)
    check(e.returncode == 0 and t.returncode == 0, f"memory --zero {zero}: {e.stderr} {t.stderr}")
    if e.returncode == 0 and t.returncode == 0:
        est, meas = json.loads(e.stdout), json.loads(t.stdout)
        check(abs(est["memory_per_device_bytes"] - meas["measured_peak_bytes"])
              <= 0.1 * meas["measured_peak_bytes"],
              f"{layout} --zero {zero}: estimated {est['memory_per_device_bytes']} measured "
              f"{meas['measured_peak_bytes']}")
        peaks[zero] = meas["measured_peak_bytes"]
if len(peaks) == 2:
    check(peaks["3"] < peaks["0"], f"FSDP holds less: {peaks}")

# The memory explain estimates is what the runtime holds (within 10%; the runtime also holds the
# reported loss), on 1, 2 and 4 devices, in 1 and 4 micro-batches; activations shrink with M.
for layout in (["tp", "dp_tp"] if mpirun else ["one", "dp", "tp", "sp"]):
    activations = {}
    for micro in ("1", "4"):
        options = ["--micro-batches", micro, "--optimizer", "adamw"]
        e = run_meshflow(meshflow, ["explain", model(layout), "--json", *options], mpirun,
                         4 if mpirun else None, timeout=300)
        t = run_meshflow(meshflow, ["train", model(layout), "--json", "--steps", "1", *options],
                         mpirun, 4 if mpirun else None, timeout=300)
        check(e.returncode == 0 and t.returncode == 0, f"memory {layout}: {e.stderr} {t.stderr}")
        if e.returncode != 0 or t.returncode != 0:
            continue
        est, meas = json.loads(e.stdout), json.loads(t.stdout)
        check(abs(est["memory_per_device_bytes"] - meas["measured_peak_bytes"])
              <= 0.1 * meas["measured_peak_bytes"],
              f"{layout} M={micro}: estimated {est['memory_per_device_bytes']} measured "
              f"{meas['measured_peak_bytes']}")
        check(sum(est["memory"].values()) == est["memory_per_device_bytes"] and
              sum(meas["measured_memory"].values()) == meas["measured_peak_bytes"],
              f"{layout} M={micro}: the breakdowns sum to the peaks")
        activations[micro] = meas["measured_memory"]["activations"]
        parts = est["est_step"]
        check(est["est_step_s"] > 0 and abs(parts["compute_s"] + parts["move_s"] + parts["update_s"]
                                            - est["est_step_s"]) <= 1e-12 * est["est_step_s"],
              f"{layout} M={micro}: est_step_s {est['est_step_s']} is the sum of {parts}")
    if layout == "one" and len(activations) == 2:
        check(activations["4"] < activations["1"], f"activations shrink with M: {activations}")

# Sequence parallelism's forward moves. Whether the logits' input is gathered or sent all-to-all
# is the cost model's choice: the built-in description fixes it (a measured one may choose either).
if not mpirun:
    r = run_meshflow(meshflow, ["explain", model("sp"), "--json", "--machine", "default"], None,
                     None, timeout=300)
    check(r.returncode == 0, r.stderr)
    forward = [(m["value"], m["steps"]) for m in json.loads(r.stdout)["moves"]
               if m["pass"] == "forward"]
    want = [("e", ["reduce_scatter"])]
    for b in ["b0", "b1"]:
        want += [(f"{b}_ln1", ["all_gather"]), (f"{b}_o", ["reduce_scatter"]),
                 (f"{b}_ln2", ["all_gather"]), (f"{b}_m", ["reduce_scatter"])]
    want += [("lnf", ["all_gather"]), ("flat", ["all_gather"])]
    check(forward == want, f"sequence-parallel forward moves {forward}")

# With 4 MiB of logits the loss runs vocabulary-parallel: the rows' statistics move, not the
# logits, in the forward and the backward, and training still equals one device (threads and
# mpirun). The choice is the cost model's: the built-in description fixes it.
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(["/usr/bin/python3", os.path.join(gpt, "make_gpt.py"), tmp, "--batch", "16",
                    "--seq", "32", "--vocab", "2048"], check=True)
    wide = os.path.join(tmp, "gpt_tp_vocab.json")
    if not mpirun:
        r = run_meshflow(meshflow, ["explain", wide, "--json", "--machine", "default"], None,
                         None, timeout=300)
        check(r.returncode == 0, r.stderr)
        moves = [(m["pass"], m["value"], m["from"]["placements"], m["to"]["placements"])
                 for m in json.loads(r.stdout)["moves"]
                 if m["value"] in ("flat", "grad:flat") or m["value"].startswith("loss")]
        check(moves == [("forward", "loss:max", ["P(max)"], ["R"]),
                        ("forward", "loss:stats", ["P(sum)"], ["R"])],
              f"vocabulary-parallel loss moves {moves}")
    train_checked([wide, "--steps", "2", "--machine", "default"], "wide tp_vocab")
    # The same layout on a 4x1 mesh, each placement on both dims: the loss's classes are sharded
    # over the dim of one device too, where its lowered steps end in R for the strategy's P(sum)
    # (the same numbers).
    j = json.load(open(wide))
    j["meshes"] = {k: f"{v}x1" for k, v in j["meshes"].items()}
    for t in [*j["tensors"].values(), *j["nodes"]]:
        if "placements" in t:
            t["placements"] = [t["placements"][0]] * 2
    unit = os.path.join(tmp, "gpt_tp_vocab_4x1.json")
    json.dump(j, open(unit, "w"))
    train_checked([unit, "--steps", "2", "--machine", "default"], "wide tp_vocab on 4x1")

    # Bad data is one line naming the node that read it, on every device (no device left
    # waiting in the loss's all-reduces): a token id outside the vocabulary, then a label.
    for data, value, want in [("tokens.npy", 2048, 'node "e": embedding: id 2048 is out of range'),
                              ("next_tokens.npy", -1, 'node "loss:stats:kernel": '
                               "softmax_cross_entropy: label -1 (row 3 of this shard)")]:
        path = os.path.join(tmp, data)
        good = np.load(path)
        bad = good.copy()
        bad.flat[3] = value
        np.save(path, bad)
        r = run_meshflow(meshflow, ["train", wide, "--steps", "1", "--machine", "default"], mpirun,
                         4 if mpirun else None, timeout=300)
        np.save(path, good)
        # (under mpirun every rank prints its line, and Open MPI its abort banner)
        errors = [l for l in r.stderr.splitlines() if l.startswith("meshflow: error:")]
        check(r.returncode != 0 and errors and all(want in l for l in errors),
              f"bad {data}: {r.returncode} {r.stderr}")

# Threads inside a device: a GPT large enough that every kernel splits (GEMMs, the loss's rows,
# attention's heads, the elementwise loops) trains with 3 threads per device to the numbers of 1
# thread, and with 2 per device on 4 devices equal to one device (--check), threads and mpirun.
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(["/usr/bin/python3", os.path.join(gpt, "make_gpt.py"), tmp, "--batch", "8",
                    "--seq", "64", "--vocab", "2048", "--dim", "64", "--heads", "4",
                    "--blocks", "1"], check=True)
    if not mpirun:
        losses = {}
        for threads in ["1", "3"]:
            r = run_meshflow(meshflow, ["train", os.path.join(tmp, "gpt_one.json"), "--steps", "2",
                                        "--threads-per-device", threads, "--json"], None, None,
                             timeout=300)
            check(r.returncode == 0, f"train --threads-per-device {threads}: {r.stderr}")
            if r.returncode == 0:
                losses[threads] = [s["loss"] for s in json.loads(r.stdout)["steps"]]
        if len(losses) == 2:
            check(all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses["3"], losses["1"])),
                  f"3 threads per device {losses['3']} vs 1 {losses['1']}")
        r = run_meshflow(meshflow, ["train", os.path.join(tmp, "gpt_one.json"),
                                    "--threads-per-device", "0"], None, None, timeout=60)
        check(r.returncode == 2 and "--threads-per-device" in r.stderr,
              f"--threads-per-device 0: {r.returncode} {r.stderr}")
    train_checked([os.path.join(tmp, "gpt_dp.json"), "--steps", "2", "--threads-per-device",
                   "2"], "gpt_dp --threads-per-device 2")

# Activation recomputation trains bit for bit as none: the same losses and gradient norms and the
# same saved weights, byte for byte (threads: meshflow/train/recompute_test.cc runs every layout;
# here the CLI on threads, and the tp, dp_tp and pp layouts under mpirun -n 4).
with tempfile.TemporaryDirectory() as tmp:
    for layout in (["tp", "dp_tp", "pp"] if mpirun else ["dp_tp", "pp"]):
        runs = {}
        for policy in ("none", "selective", "full"):
            save = os.path.join(tmp, f"{layout}_{policy}")
            r = run_meshflow(meshflow, ["train", model(layout), "--steps", "3", "--optimizer",
                                        "adamw", "--micro-batches", "2", "--recompute", policy,
                                        "--save", save, "--json"], mpirun, 4 if mpirun else None,
                             timeout=300)
            check(r.returncode == 0, f"{layout} --recompute {policy}: {r.stderr[-300:]}")
            if r.returncode == 0:
                steps = json.loads(r.stdout)["steps"]
                runs[policy] = ([(s["loss"], s["grad_norm"]) for s in steps], save)
        for policy in ("selective", "full"):
            if policy not in runs or "none" not in runs:
                continue
            check(runs[policy][0] == runs["none"][0],
                  f"{layout} --recompute {policy}: losses and norms {runs[policy][0]} against "
                  f"{runs['none'][0]}")
            a, b = runs[policy][1], runs["none"][1]
            files = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a)
                           for f in fs if f.endswith(".npy"))
            check(files and all(filecmp.cmp(os.path.join(a, f), os.path.join(b, f),
                                            shallow=False) for f in files),
                  f"{layout} --recompute {policy}: the saved weights differ from none's")

finish()
