"""Surviving failures (DESIGN.md "Surviving failures"): a device that fails mid-step ends the run
promptly with exit 3 and one line naming the device and the step; a run killed at random
instants (and during a checkpoint's write) and restarted by `meshflow launch --max-restarts 3`
with `--resume auto` ends with the checkpoint (weights, optimizer state, data position) of an
uninterrupted run, bit for bit, and the steps it repeats report the losses they had; bad input
stays exit 1 and is never restarted; `--resume auto` starts at step 1 without a checkpoint.
Under --mpi the same under mpirun -n 4, with one rank killed (SIGKILL) and one stopped (SIGSTOP,
--timeout 5): every process is gone within the bound, no checkpoint in progress is committed
and the earlier ones verify.
Usage: cli_failures_test.py MESHFLOW FAULT_PROGRAM EXAMPLES [--mpi MPIRUN]"""
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from checks import check, finish

meshflow, fault_program, examples = sys.argv[1:4]
mpirun = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--mpi" else None
mpi = [mpirun, "--oversubscribe", "--allow-run-as-root"] if mpirun else []
tmp = tempfile.mkdtemp(prefix="meshflow_failures_test_")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # however the script ends


def our_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("meshflow")]


def timed(cmd, limit=120):
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    return r, time.monotonic() - start


# 1. A device that fails mid-step (injected): exit 3, one line naming the device and the step.
model = os.path.join(examples, "dp_tp_mlp.json")
cmd = ([*mpi, "-n", "4", fault_program, model, "2", "3", "fail", "mpi"] if mpirun
       else [fault_program, model, "2", "3", "fail"])
r, took = timed(cmd)
lines = [l for l in our_lines(r.stderr) if "error" in l]
check(r.returncode == 3, f"a failed device: exit {r.returncode}: {r.stderr[-400:]}")
check(took < 30, f"a failed device: the run ended after {took:.1f} s")
check(len(lines) >= 1 and "device 2" in lines[0] and "step 3" in lines[0]
      and "the injected failure" in lines[0], f"a failed device: the line {lines}")

# A GPT reading a dataset, sized so that a step and a checkpoint's write take a while.
data = os.path.join(tmp, "data")
gpt = os.path.join(tmp, "gpt")
subprocess.run(["/usr/bin/python3", os.path.join(examples, "gpt", "make_gpt.py"), gpt, "--vocab",
                "64", "--seq", "64", "--dim", "128", "--heads", "4", "--blocks", "2", "--batch",
                "16", "--devices", "4"], check=True, capture_output=True)
gpt_model = os.path.join(gpt, "gpt_dp_data.json")
STEPS = 8


def train_args(ckpt, logs, *extra):
    return ["train", gpt_model, "--steps", str(STEPS), "--optimizer", "adamw", "--lr", "3e-3",
            "--checkpoint", ckpt, "--checkpoint-every", "2", "--resume", "auto", "--log-dir", logs,
            *extra]


def launch_cmd(ckpt, logs):
    head = [meshflow, "launch", "--max-restarts", "3"]
    if mpirun:
        head += ["-n", "4", "--mpirun-args", "--oversubscribe --allow-run-as-root"]
    return head + ["--"] + train_args(ckpt, logs)


def final(ckpt):
    """The step-8 checkpoint's files' hashes, optimizer and data position."""
    doc = json.load(open(os.path.join(ckpt, f"step-{STEPS}", "checkpoint.json")))
    return {"tensors": {n: t["files"] for n, t in doc["tensors"].items()},
            "optimizer": doc["optimizer"], "data": doc.get("data")}


def losses(logs):
    out = {}
    for line in open(os.path.join(logs, "metrics.jsonl")):
        d = json.loads(line)
        if "loss" in d:
            out.setdefault(d["step"], []).append(d["loss"])
    return out


# The uninterrupted run.
ref_ckpt, ref_logs = os.path.join(tmp, "ref_ck"), os.path.join(tmp, "ref_logs")
start = time.monotonic()
r = subprocess.run(launch_cmd(ref_ckpt, ref_logs), capture_output=True, text=True, timeout=300)
duration = time.monotonic() - start
check(r.returncode == 0, f"the uninterrupted run: {r.stderr[-500:]}")
reference = final(ref_ckpt)
ref_losses = losses(ref_logs) if os.path.exists(os.path.join(ref_logs, "metrics.jsonl")) else {}
check(sorted(ref_losses) == list(range(1, STEPS + 1)), f"the reference's steps: {sorted(ref_losses)}")


def descendants(pid):
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    children = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            children.setdefault(int(parts[1]), []).append((int(parts[0]), parts[2]))
    found, todo = [], [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found.append((child, args))
            todo.append(child)
    return found


def victims(launcher):
    """The training processes under `launcher` (one on threads; the ranks under mpirun)."""
    return [p for p, a in descendants(launcher) if " train " in a and "launch" not in a
            and not a.startswith(mpirun or "\0") and "prterun" not in a and "orted" not in a]


rng = random.Random(60)
instants = [("at", rng.uniform(0.2, 0.9) * duration) for _ in range(3)] + [("during a write", None)]
for kind, at in instants:
    ckpt, logs = os.path.join(tmp, f"ck_{kind[0]}_{at}"), os.path.join(tmp, f"logs_{kind[0]}_{at}")
    p = subprocess.Popen(launch_cmd(ckpt, logs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    killed = None
    deadline = time.monotonic() + 120
    began = time.monotonic()
    while time.monotonic() < deadline and killed is None and p.poll() is None:
        ready = (at is not None and time.monotonic() - began >= at) or (
            at is None and os.path.isdir(ckpt) and
            any(n.startswith(".step-") for n in os.listdir(ckpt)))
        if ready:
            procs = victims(p.pid)
            if procs:
                killed = procs[rng.randrange(len(procs))]
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.002)
    out, err = p.communicate(timeout=300)
    what = f"killed {kind} {at and round(at, 2)}"
    print(f"{what} s into a run of {duration:.2f} s: pid {killed}:",
          [l for l in err.splitlines() if "restart" in l])
    check(p.returncode == 0, f"{what}: launch exit {p.returncode}: {err[-600:]}")
    if killed is not None:
        check("restart 1 of 3 after" in err, f"{what}: the restart line: {err[-400:]}")
    if p.returncode == 0:
        check(final(ckpt) == reference, f"{what}: the final checkpoint equals the uninterrupted run's")
        got = losses(logs)
        check(sorted(got) == list(range(1, STEPS + 1)), f"{what}: steps {sorted(got)}")
        for step, values in got.items():
            check(all(v == ref_losses.get(step, [None])[0] for v in values),
                  f"{what}: step {step} reported {values}, uninterrupted {ref_losses.get(step)}")

# Bad input is never restarted: exit 1 once.
bad = os.path.join(tmp, "bad.json")
doc = json.load(open(gpt_model))
doc["train"] = {"optimizer": "nonesuch"}
json.dump(doc, open(bad, "w"))
shutil.copytree(os.path.join(gpt, "data"), os.path.join(tmp, "data"), dirs_exist_ok=True)
r = subprocess.run([meshflow, "launch", *(["-n", "4", "--mpirun-args", "--oversubscribe --allow-run-as-root"] if mpirun else []),
                    "--", "train", bad, "--checkpoint", os.path.join(tmp, "bad_ck"), "--resume", "auto"],
                   capture_output=True, text=True, timeout=120)
check(r.returncode == 1 and "restart" not in r.stderr, f"bad input: exit {r.returncode}: {r.stderr[-300:]}")
r = subprocess.run([meshflow, "launch", "--", "train", gpt_model, "--steps", "2"], capture_output=True,
                   text=True, timeout=60)
check(r.returncode == 1 and "--checkpoint DIR --resume auto" in r.stderr,
      f"launch without --resume auto: {r.returncode} {r.stderr.strip()}")

# --resume auto: no checkpoint starts at step 1; the run at its last step runs nothing.
fresh = os.path.join(tmp, "fresh")
args = ["train", gpt_model, "--steps", "2", "--checkpoint", fresh, "--resume", "auto", "--json"]
r = subprocess.run([*mpi, *(["-n", "4"] if mpirun else []), meshflow, *args,
                    *(["--backend", "mpi"] if mpirun else [])], capture_output=True, text=True, timeout=120)
check(r.returncode == 0 and [s["step"] for s in json.loads(r.stdout)["steps"]] == [1, 2],
      f"--resume auto without a checkpoint: {r.stderr[-300:]}")
r = subprocess.run([*mpi, *(["-n", "4"] if mpirun else []), meshflow, *args,
                    *(["--backend", "mpi"] if mpirun else [])], capture_output=True, text=True, timeout=120)
check(r.returncode == 0 and "no step to run" in r.stderr, f"--resume auto at the last step: {r.stderr[-300:]}")
# A damaged newest checkpoint is an error naming the file, never a silent fall-back.
newest = os.path.join(fresh, "step-2")
victim = next(os.path.join(d, f) for d, _, fs in os.walk(newest) for f in fs if f.endswith(".npy"))
with open(victim, "r+b") as f:
    f.seek(-4, os.SEEK_END)
    f.write(b"\xff\xff\xff\xff")
args[3] = "3"
r = subprocess.run([*mpi, *(["-n", "4"] if mpirun else []), meshflow, *args,
                    *(["--backend", "mpi"] if mpirun else [])], capture_output=True, text=True, timeout=120)
check(r.returncode == 1 and os.path.basename(victim) in r.stderr and "sha256" in r.stderr,
      f"--resume auto with a damaged newest checkpoint: {r.returncode} {r.stderr[-300:]}")

if not mpirun:
    # Resumed elsewhere: 4 devices to step 4, then autoshard's layout on 3 from the checkpoint,
    # which reads on from the saved data row: equal to the uninterrupted run and to one device
    # resumed from the same checkpoint (--check).
    small = os.path.join(tmp, "small")
    subprocess.run(["/usr/bin/python3", os.path.join(examples, "gpt", "make_gpt.py"), small,
                    "--vocab", "64", "--seq", "32", "--dim", "64", "--heads", "4", "--batch", "12",
                    "--devices", "4"], check=True, capture_output=True)
    m = os.path.join(small, "gpt_dp_data.json")
    common = ["--optimizer", "adamw", "--lr", "3e-3", "--resume", "auto", "--json"]
    whole = subprocess.run([meshflow, "train", m, "--steps", "6", "--checkpoint",
                            os.path.join(tmp, "whole_ck"), *common], capture_output=True, text=True)
    first = subprocess.run([meshflow, "train", m, "--steps", "4", "--checkpoint",
                            os.path.join(tmp, "moved_ck"), *common], capture_output=True, text=True)
    moved = subprocess.run([meshflow, "train", m, "--auto", "--mesh", "3", "--steps", "6",
                            "--checkpoint", os.path.join(tmp, "moved_ck"), "--check", *common],
                           capture_output=True, text=True)
    ok = whole.returncode == 0 and first.returncode == 0 and moved.returncode == 0
    check(ok, f"resumed on 3 devices: {moved.stderr[-400:]}")
    if ok:
        w = {s["step"]: s["loss"] for s in json.loads(whole.stdout)["steps"]}
        r = json.loads(moved.stdout)
        check([s["step"] for s in r["steps"]] == [5, 6], f"resumed on 3: steps {r['steps']}")
        check(all(abs(s["loss"] - w[s["step"]]) < 1e-4 for s in r["steps"]),
              f"resumed on 3: the same rows as the uninterrupted run: {r['steps']} vs {w}")
        check(r["check"]["max_loss_diff"] < 1e-4, f"resumed on 3 against one device: {r['check']}")

if mpirun:
    # One rank killed, one stopped: every process gone within the bound.
    for sig, bound in ((signal.SIGKILL, 30), (signal.SIGSTOP, 5 + 30)):
        ckpt = os.path.join(tmp, f"mpi_{sig}")
        cmd = [*mpi, "-n", "4", meshflow, "train", gpt_model, "--steps", "100000", "--backend",
               "mpi", "--timeout", "5", "--checkpoint", ckpt, "--checkpoint-every", "3"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not (os.path.isdir(ckpt) and any(n.startswith("step-") for n in os.listdir(ckpt))):
            time.sleep(0.05)
        ranks = [pid for pid, a in descendants(p.pid) if " train " in a and "prterun" not in a]
        os.kill(ranks[-1], sig)
        hit = time.monotonic()
        try:
            out, err = p.communicate(timeout=bound + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        def alive():
            out = []
            for pid in ranks:
                try:
                    if open(f"/proc/{pid}/stat").read().split()[2] not in "ZX":
                        out.append(pid)
                except OSError:
                    pass
            return out

        # The time until the last process is gone (mpirun may return while they exit).
        while alive() and time.monotonic() - hit < bound + 30:
            time.sleep(0.05)
        took = time.monotonic() - hit
        left = alive()
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        name = "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP"
        print(f"{name} of one rank: the last process gone {took:.1f} s after it, mpirun exit {p.returncode}")
        check(took <= bound and not left, f"{name}: every process gone after {took:.1f} s (left {left})")
        check(p.returncode != 0, f"{name}: mpirun exit {p.returncode}")
        if sig == signal.SIGSTOP:
            check(any("error" in l for l in our_lines(err)), f"SIGSTOP: a process's line: {err[-400:]}")
        check(not any(n.startswith("step-") and not os.path.exists(os.path.join(ckpt, n, "checkpoint.json"))
                      for n in os.listdir(ckpt)), f"{name}: no half-committed checkpoint")
        v = subprocess.run([meshflow, "checkpoint", ckpt, "--verify"], capture_output=True, text=True)
        check(v.returncode == 0, f"{name}: the committed checkpoints verify: {v.stdout[-300:]} {v.stderr[-300:]}")

finish()
