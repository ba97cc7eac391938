"""NumPy reads what meshflow writes and meshflow reads what NumPy writes, for every dtype, and
meshflow rejects the arrays it must not read. Usage: numpy_interop_test.py MESHFLOW_BINARY"""
import os
import subprocess
import sys
import tempfile

import numpy as np

meshflow = sys.argv[1]
failures = 0


def run(*args):
    return subprocess.run([meshflow, *args], capture_output=True, text=True)


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAILED:", what)


rng = np.random.default_rng(7)
with tempfile.TemporaryDirectory() as tmp:
    cases = [(np.float32, (13, 5)), (np.float64, (4, 3, 2)), (np.int32, (7,)), (np.int64, (2, 9)),
             (np.float32, (0, 3)), (np.float64, ())]
    for i, (dtype, shape) in enumerate(cases):
        x = (rng.standard_normal(shape) * 1000).astype(dtype)
        src, out, back = (os.path.join(tmp, f"{n}{i}") for n in ("x", "sharded", "y"))
        np.save(src + ".npy", x)
        mesh, placements = ("2x2", "S(0),R") if len(shape) else ("4", "R")
        r = run("shard", "--input", src + ".npy", "--mesh", mesh, "--placements", placements, "--out", out)
        check(r.returncode == 0, f"shard {dtype.__name__}{shape}: {r.stderr}")
        for k in range(4):
            part = np.load(os.path.join(out, f"rank{k}.npy"))
            check(part.dtype == x.dtype, f"rank{k} dtype")
        r = run("gather", "--in", out, "--out", back + ".npy")
        check(r.returncode == 0, f"gather {dtype.__name__}{shape}: {r.stderr}")
        y = np.load(back + ".npy")
        check(y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes(),
              f"round trip {dtype.__name__}{shape}")

    bad = {
        "big-endian": np.arange(6, dtype=">f4").reshape(2, 3),
        "Fortran": np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)),
        "unsupported dtype": np.arange(6, dtype=np.float16),
        "object": np.array([1, "a"], dtype=object),
    }
    for needle, arr in bad.items():
        path = os.path.join(tmp, "bad.npy")
        np.save(path, arr, allow_pickle=True)
        r = run("shard", "--input", path, "--mesh", "2", "--placements", "R", "--out", os.path.join(tmp, "o"))
        check(r.returncode == 1 and needle in r.stderr, f"{needle}: rc {r.returncode} {r.stderr}")
    # Version 2.0 and 3.0 headers as NumPy writes them.
    for version in ((2, 0), (3, 0)):
        path = os.path.join(tmp, "v.npy")
        x = rng.standard_normal((3, 4)).astype(np.float32)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, x, version=version)
        r = run("shard", "--input", path, "--mesh", "2", "--placements", "S(1)", "--out", os.path.join(tmp, "v"))
        check(r.returncode == 0, f"version {version}: {r.stderr}")

print(f"{'0 failed' if failures == 0 else str(failures) + ' failed'}")
sys.exit(1 if failures else 0)
