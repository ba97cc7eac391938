"""Faults under mpirun never hang: a device that stalls or dies makes every device fail within
the timeout, and ranks started with different arguments or files (or one that fails while
preparing) all fail before the first collective, with one line printed once.
Usage: mpi_faults_test.py MPIRUN MESHFLOW FAULT_PROGRAM"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from checks import check, finish

mpirun, meshflow, fault_program = sys.argv[1:4]
mpi = [mpirun, "--oversubscribe", "--allow-run-as-root"]


def run(cmd, limit=60):
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    return r, time.monotonic() - start


def our_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("meshflow")]


# A stalled device: device 0's watchdog reports at the 2 s deadline and the job ends.
r, took = run(mpi + ["-n", "4", fault_program, "stall"])
check(r.returncode != 0, f"stall: exit {r.returncode}")
check(took < 30, f"stall: the job ended after {took:.1f} s")
lines = our_lines(r.stderr)
check(r.returncode == 3, f"stall: exit status 3 (a runtime failure), got {r.returncode}")
check(len(lines) == 1 and "device 0: all_reduce on devices [0,1,2,3] timed out after 2000 ms" in lines[0],
      f"stall: one line from device 0: {lines}")

# A device that dies: mpirun ends the job; nobody waits forever.
r, took = run(mpi + ["-n", "4", fault_program, "die"])
check(r.returncode != 0, f"die: exit {r.returncode}")
check(took < 30, f"die: the job ended after {took:.1f} s")

with tempfile.TemporaryDirectory() as tmp:
    x = np.random.default_rng(5).standard_normal((13, 6)).astype(np.float32)
    np.save(f"{tmp}/x.npy", x)
    subprocess.run([meshflow, "shard", "--input", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),S(1)",
                    "--out", f"{tmp}/a"], check=True)
    base = [meshflow, "redistribute", "--backend", "mpi", "--in", f"{tmp}/a", "--out", f"{tmp}/b"]
    # Ranks started with different arguments (MPMD): all fail before any collective, one line.
    r, took = run(mpi + ["-n", "2", *base, "--to", "R,S(0)", ":", "-n", "2", *base, "--to", "S(1),R"])
    check(r.returncode != 0, f"disagree: exit {r.returncode}")
    lines = our_lines(r.stderr)
    check(len(lines) == 1 and "mpi ranks disagree on the plan before the first collective" in lines[0]
          and "rank 2" in lines[0], f"disagree: one line naming the difference: {lines}")
    check(not os.path.exists(f"{tmp}/b"), "disagree: no output")
    # One rank fails while preparing (its source folder does not exist): every rank fails.
    bad = [meshflow, "redistribute", "--backend", "mpi", "--in", f"{tmp}/nowhere", "--out", f"{tmp}/b", "--to", "R,R"]
    r, took = run(mpi + ["-n", "3", *base, "--to", "R,R", ":", "-n", "1", *bad])
    lines = our_lines(r.stderr)
    check(r.returncode != 0 and took < 30, f"prepare failure: exit {r.returncode} after {took:.1f} s")
    check(len(lines) == 1 and "device 3:" in lines[0] and "nowhere" in lines[0],
          f"prepare failure: one line naming device 3 and the folder: {lines}")
    # The same bad input on every rank: printed once, by device 0.
    r, took = run(mpi + ["-n", "4", *bad])
    lines = our_lines(r.stderr)
    check(r.returncode != 0 and len(lines) == 1 and "nowhere" in lines[0], f"bad input everywhere: {lines}")
    # Replicas that disagree: found by the shard-hash check before the plan runs.
    subprocess.run([meshflow, "shard", "--input", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),R",
                    "--out", f"{tmp}/rep"], check=True)
    t = np.load(f"{tmp}/rep/rank3.npy")
    t[1, 1] += 1
    np.save(f"{tmp}/rep/rank3.npy", t)
    r, took = run(mpi + ["-n", "4", meshflow, "redistribute", "--backend", "mpi", "--in", f"{tmp}/rep", "--to", "R,R",
                         "--out", f"{tmp}/c"])
    lines = our_lines(r.stderr)
    check(r.returncode != 0 and len(lines) == 1 and "replicas disagree: devices 2 (rank2) and 3 (rank3)" in lines[0],
          f"replicas under mpi: {lines}")
    check(not os.path.exists(f"{tmp}/c"), "replicas under mpi: no output")

finish()
