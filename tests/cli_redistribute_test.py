"""`meshflow plan` and `meshflow redistribute` from the command line, on threads and (with
--mpi MPIRUN) under mpirun: results are checked with NumPy against the original array, and
every error path is checked for its exit code and one-line message.
Usage: cli_redistribute_test.py MESHFLOW [--mpi MPIRUN]"""
import json
import os
import sys
import tempfile

import numpy as np

from checks import check, finish, run_meshflow

meshflow = sys.argv[1]
mpirun = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--mpi" else None


def run(*args, ranks=None):
    return run_meshflow(meshflow, args, mpirun, ranks)


def gather(folder, out):
    r = run("gather", "--in", folder, "--out", out)
    check(r.returncode == 0, f"gather {folder}: {r.stderr}")
    return np.load(out)


rng = np.random.default_rng(3)
with tempfile.TemporaryDirectory() as tmp:
    x = rng.standard_normal((13, 6)).astype(np.float32)
    np.save(f"{tmp}/x.npy", x)
    r = run("shard", "--input", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),S(1)", "--out", f"{tmp}/a")
    check(r.returncode == 0, r.stderr)
    cases = [("R,S(0)", None, None), ("S(1)", "4", None), ("S(0),R", "2x2@4,5,6,7", None), ("S(1),S(0)", None, None)]
    if mpirun:
        cases += [("S(1)", "4@4,5,6,7", 8), ("R,S(1)", None, 4), ("S(0)", "3@1,2,3", 4)]
    for i, (to, to_mesh, ranks) in enumerate(cases):
        args = ["redistribute", "--in", f"{tmp}/a", "--to", to, "--out", f"{tmp}/b{i}", "--json"]
        if to_mesh:
            args += ["--to-mesh", to_mesh]
        r = run(*args, ranks=ranks)
        check(r.returncode == 0, f"redistribute to {to} {to_mesh} ranks {ranks}: {r.stderr}")
        if r.returncode != 0:
            continue
        report = json.loads(r.stdout)
        check(report["planner"] and report["seconds"] >= 0 and report["steps"], f"json {report}")
        y = gather(f"{tmp}/b{i}", f"{tmp}/y{i}.npy")
        check(y.tobytes() == x.tobytes(), f"round trip via {to} {to_mesh} ranks {ranks}")

    # Partial sources: a P(sum) folder written by hand, reduced by redistribute.
    os.makedirs(f"{tmp}/p")
    terms = [rng.standard_normal((4, 3)).astype(np.float64) for _ in range(2)]
    for k, t in enumerate(terms):
        np.save(f"{tmp}/p/rank{k}.npy", t)
    with open(f"{tmp}/p/layout.json", "w") as f:
        json.dump({"mesh": {"shape": [2], "devices": [0, 1], "names": []}, "placements": ["P(sum)"],
                   "shape": [4, 3], "dtype": "float64"}, f)
    r = run("redistribute", "--in", f"{tmp}/p", "--to", "S(1)", "--out", f"{tmp}/q")
    check(r.returncode == 0, r.stderr)
    check(np.allclose(gather(f"{tmp}/q", f"{tmp}/q.npy"), terms[0] + terms[1], rtol=1e-12), "P(sum) reduced")

    # plan: text and JSON in the contract (docs/contract.md).
    r = run("plan", "--mesh", "2x2x2", "--shape", "16x16x16", "--from", "P(sum),R,P(sum)", "--to", "R,R,R", "--json")
    check(r.returncode == 0, r.stderr)
    plan = json.loads(r.stdout)
    for key in ("planner", "est_s", "min_bytes", "steps"):
        check(key in plan, f"plan json lacks {key}")
    check([s["kind"] for s in plan["steps"]] == ["all_reduce"], f"single all_reduce: {plan['steps']}")
    step = plan["steps"][0]
    check(step["mesh_dims"] == [0, 2] and len(step["devices"]) == 8 and step["bytes_per_device"] > 0, f"step {step}")
    r = run("plan", "--mesh", "4", "--shape", "8x8", "--from", "S(0)", "--to", "R")
    check(r.returncode == 0 and "all_gather" in r.stdout and "alternative" in r.stdout, r.stdout)

    # Errors: one line, exit 1 (2 for usage), no output folder.
    def expect_error(args, needle, code=1, out=None):
        r = run(*args)
        check(r.returncode == code and needle in r.stderr and r.stderr.count("\n") == 1,
              f"{args}: rc {r.returncode} stderr {r.stderr!r}")
        if out:
            check(not os.path.exists(out), f"{args} left {out}")

    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "P(sum),R", "--out", f"{tmp}/e1"],
                 "cannot redistribute mesh dim 0 from S(0) to P(sum)", out=f"{tmp}/e1")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "S(0)", "--out", f"{tmp}/e2"],
                 "mesh 2x2 has 2 dims but placements \"S(0)\" give 1: give one placement per mesh dim", out=f"{tmp}/e2")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "S(9),R", "--out", f"{tmp}/e3"], "\"S(9)\"", out=f"{tmp}/e3")
    expect_error(["redistribute", "--in", f"{tmp}/nowhere", "--to", "R,R", "--out", f"{tmp}/e4"], "nowhere", out=f"{tmp}/e4")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "R", "--to-mesh", "4@1,1,2,3", "--out", f"{tmp}/e5"],
                 "device 1 twice", out=f"{tmp}/e5")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "R,R", "--out", f"{tmp}/e6", "--backend", "carrier-pigeon"],
                 "unknown backend \"carrier-pigeon\"", out=f"{tmp}/e6")
    expect_error(["plan", "--mesh", "2x2", "--shape", "4x4", "--from", "R,P(sum)", "--to", "R,P(max)"], "partial ops differ")
    expect_error(["plan", "--mesh", "2x2", "--shape", "4xq", "--from", "R,R", "--to", "R,R"], "\"4xq\"")
    expect_error(["plan", "--mesh", "2x2", "--shape", "4x4", "--from", "R,R", "--to", "R,R", "--machine", f"{tmp}/x.npy"],
                 "invalid JSON")
    with open(f"{tmp}/a/rank2.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00garbage")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "R,R", "--out", f"{tmp}/e7"], "rank2.npy", out=f"{tmp}/e7")
    expect_error(["redistribute", "--in", f"{tmp}/a", "--to", "R,R"], "--out", code=2)
    leftovers = [n for n in os.listdir(tmp) if ".tmp-" in n]
    check(not leftovers, f"temporary folders left behind: {leftovers}")

finish()
