"""Checkpoints from the command line: a run saved on threads resumes under mpirun and one saved
under mpirun resumes on threads, onto another layout, equal to one device resumed alike
(--check); `meshflow checkpoint --verify` names a damaged file and exits 1, and resuming from it
is one line naming the file and the checkpoint to resume instead; a run killed with SIGKILL at
20 seeded random instants (and, under mpirun, a rank killed at 5) leaves no half-written
step-<k>, every listed checkpoint verifies, and --resume goes on from the newest.
Usage: cli_checkpoint_test.py MESHFLOW GPT_DIR [--mpi MPIRUN]"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from checks import check, finish, run_meshflow

meshflow, gpt = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
TOLERANCE = 1e-5
ADAMW = ["--optimizer", "adamw", "--lr", "0.003"]


def model(layout):
    return os.path.join(gpt, f"gpt_{layout}.json")


def steps_of(result):
    return [(s["step"], s["loss"]) for s in json.loads(result.stdout)["steps"]]


def consistent(folder, what):
    """Every step-<k> in `folder` is complete and verifies; returns the newest step (0: none)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    for n in names:
        if n.startswith("step-"):
            check(os.path.isfile(os.path.join(folder, n, "checkpoint.json")),
                  f"{what}: {n} is half-written")
    r = run_meshflow(meshflow, ["checkpoint", folder, "--verify", "--json"])
    check(r.returncode == 0, f"{what}: checkpoint --verify: {r.stderr}")
    listed = json.loads(r.stdout)["checkpoints"] if r.returncode == 0 else []
    check(all(c["verified"] for c in listed), f"{what}: {listed}")
    return max([c["step"] for c in listed], default=0)


with tempfile.TemporaryDirectory() as tmp:
    # Uninterrupted: 4 steps on one device.
    r = run_meshflow(meshflow, ["train", model("one"), "--steps", "4", "--json", *ADAMW])
    check(r.returncode == 0, r.stderr)
    whole = steps_of(r)
    if mpirun:
        # Saved on threads (DP), resumed under mpirun (DP x TP); saved under mpirun (DP x TP,
        # ZeRO-1), resumed on threads (one device).
        pairs = [(("dp", None, []), ("dp_tp", 4, [])),
                 (("dp_tp", 4, ["--zero", "1"]), ("one", None, []))]
        for i, ((save_layout, save_ranks, save_opts), (load_layout, load_ranks, _)) in enumerate(pairs):
            folder = os.path.join(tmp, f"cross{i}")
            r = run_meshflow(meshflow, ["train", model(save_layout), "--steps", "2", *ADAMW,
                                        *save_opts, "--checkpoint", folder], mpirun, save_ranks)
            check(r.returncode == 0, f"save {save_layout}: {r.stderr}")
            r = run_meshflow(meshflow, ["train", model(load_layout), "--steps", "2", "--resume",
                                        folder, "--check", "--json"], mpirun, load_ranks)
            check(r.returncode == 0, f"resume {load_layout}: {r.stderr}")
            if r.returncode == 0:
                got = steps_of(r)
                check([s for s, _ in got] == [3, 4], f"steps go on: {got}")
                check(all(abs(a[1] - b[1]) <= TOLERANCE for a, b in zip(got, whole[2:])),
                      f"{save_layout} -> {load_layout}: {got} against {whole[2:]}")
                out = json.loads(r.stdout)["check"]
                check(out["max_weight_diff"] <= TOLERANCE, f"{save_layout} -> {load_layout}: {out}")

        # A rank killed while the run checkpoints every step: the run ends, and what it leaves
        # is consistent and resumable.
        rng = random.Random(7)
        folder = os.path.join(tmp, "killed_mpi")
        for attempt in range(5):
            cmd = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", "4", meshflow, "train",
                   model("dp"), "--backend", "mpi", "--steps", "100000", *ADAMW,
                   "--checkpoint", folder, "--checkpoint-every", "1", "--keep-last", "2"]
            if attempt > 0 and consistent(folder, "before"):
                cmd += ["--resume", folder]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(1.0, 2.5))
            ranks = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                   text=True).stdout.split()
            check(len(ranks) > 0, "mpirun's ranks")
            if ranks:
                os.kill(int(rng.choice(ranks)), signal.SIGKILL)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                check(False, "mpirun did not end after a rank was killed")
            consistent(folder, f"mpi kill {attempt}")
        newest = consistent(folder, "mpi kills")
        check(newest > 0, "the mpi runs checkpointed")
        r = run_meshflow(meshflow, ["train", model("dp"), "--steps", "1", "--resume", folder,
                                    "--json"], mpirun, 4)
        check(r.returncode == 0 and steps_of(r)[0][0] == newest + 1, f"resume: {r.stderr}")
    else:
        # SIGKILL at 20 seeded random instants of a run checkpointing every step.
        rng = random.Random(11)
        folder = os.path.join(tmp, "killed")
        newest = 0
        for attempt in range(20):
            cmd = [meshflow, "train", model("dp"), "--steps", "100000", *ADAMW, "--checkpoint",
                   folder, "--checkpoint-every", "1", "--keep-last", "2"]
            if newest:
                cmd += ["--resume", folder]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.2, 0.8))
            p.send_signal(signal.SIGKILL)
            p.wait()
            before = newest
            newest = consistent(folder, f"kill {attempt}")
            check(newest >= before, f"kill {attempt}: the newest checkpoint went back")
        check(newest > 0, "the killed runs checkpointed")
        r = run_meshflow(meshflow, ["train", model("dp"), "--steps", "1", "--resume", folder,
                                    "--json"])
        check(r.returncode == 0 and steps_of(r)[0][0] == newest + 1,
              f"resume after the kills: {r.stderr}")

        # A damaged file: --verify names it (exit 1); resuming is one line naming it and the
        # checkpoint to resume instead.
        folder = os.path.join(tmp, "damaged")
        r = run_meshflow(meshflow, ["train", model("dp"), "--steps", "2", *ADAMW, "--checkpoint",
                                    folder, "--checkpoint-every", "1"])
        check(r.returncode == 0, r.stderr)
        bad = os.path.join(folder, "step-2", "head.exp_avg", "rank0.npy")
        with open(bad, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        r = run_meshflow(meshflow, ["checkpoint", folder, "--verify"])
        check(r.returncode == 1 and bad in r.stderr and "DAMAGED" in r.stdout,
              f"--verify: {r.returncode} {r.stdout} {r.stderr}")
        r = run_meshflow(meshflow, ["train", model("dp"), "--steps", "1", "--resume", folder])
        want = (f"meshflow: error: {bad}: its bytes do not match its sha256 (resume from "
                f"{os.path.join(folder, 'step-1')} instead)")
        check(r.returncode == 1 and r.stderr.strip().splitlines() == [want],
              f"resume from a damaged checkpoint: {r.returncode} {r.stderr}")

finish()
