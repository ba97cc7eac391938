"""Every issue's headline figure at small sizes, each printed against its target: run before a
change lands (scripts/bench-headlines) to see one it slows. Exits 1 when a figure misses its
target, 2 when a bench fails to run.
Usage: bench_headlines.py MESHFLOW EXAMPLES_DIR [--mpirun MPIRUN]"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

meshflow, examples = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpirun" else None
rows = []  # (headline, figure, target, met)
failed_to_run = []


def bench(*args, ranks=None, env=None):
    """Returns a bench's JSON report (None, noted, when it fails)."""
    cmd = [meshflow, "bench", *args, "--json", "--quiet"]
    if ranks:
        cmd = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        failed_to_run.append(f"{' '.join(args)}: {r.stderr.strip()[-300:]}")
        return None
    return json.loads(r.stdout)


def row(headline, figure, target, met):
    rows.append((headline, figure, target, met))
    print(f"  {'ok    ' if met else 'MISSED'}  {headline}: {figure} (target {target})", flush=True)


def cases(report, name=None):
    return [c for c in (report or {}).get("results", []) if name is None or c["case"] == name]


start = time.monotonic()
print("headline figures (small sizes; this machine's measured description prices the estimates)")

# 63: the first calibration of this machine, in a cache folder of its own.
with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    r = subprocess.run([meshflow, "explain", os.path.join(examples, "dp_tp_mlp.json")],
                       capture_output=True, text=True, timeout=600, env=env)
    took = re.search(r"measured in ([0-9.]+) s", r.stderr)
    if r.returncode != 0 or not took:
        failed_to_run.append(f"explain with an empty cache: {r.stderr.strip()[-300:]}")
    else:
        row("first calibration (4 devices)", f"{float(took.group(1)):.1f} s", "< 60 s",
            float(took.group(1)) < 60)

# 63: compile time of the 1,000-layer chain on 8x8.
for c in cases(bench("train", "--cases", "compile", "--reps", "3")):
    row("compile: 1,000-layer MLP on 8x8", f"{c['median_s']:.3f} s", "< 1 s", c["median_s"] < 1.0)

# 63: explain's estimate against the measured step, MLP and GPT on 1 and 2 devices.
for c in cases(bench("train", "--cases", "train_step", "gpt_step", "--reps", "3")):
    if c["devices"] > 2:
        continue
    e = c.get("est_vs_measured") or 0
    row(f"est_vs_measured {c['case']} on {c['mesh']}", f"{e:.2f}", "0.75-1.25", 0.75 <= e <= 1.25)

# 55, 63: automatic sharding against the best hand layout, and the estimates' ranking.
report = bench("autoshard", "--models", "mlp", "--meshes", "2,4", "--reps", "2", "--no-search")
for c in cases(report):
    row(f"autoshard {c['case']} vs best hand layout", f"{c['vs_baseline']:.2f}x", "<= 1.1x",
        c["vs_baseline"] <= 1.1)
if cases(report):
    rho = cases(report)[0]["rank_correlation"]
    row("autoshard mlp rank correlation", f"{rho:.2f}", ">= 0.8", rho >= 0.8)

# The planner and the operator path: each case's own target_s.
for args in [("redistribute", "--sizes", "16M", "--reps", "3"), ("ops", "--reps", "3")]:
    for c in cases(bench(*args)):
        if "target_s" in c:
            row(f"{args[0]} {c['case']}", f"{c['median_s'] * 1e6:.1f} us",
                f"<= {c['target_s'] * 1e6:g} us", c["median_s"] <= c["target_s"])

# Checkpoints: a run that saves against one that does not, within its own target.
for c in cases(bench("checkpoint", "--mib", "64", "--reps", "2")):
    if "target_vs_baseline" in c and c.get("vs_baseline"):
        row(f"checkpoint {c['case']}", f"{c['vs_baseline']:.2f}x",
            f"<= {c['target_vs_baseline']:.2f}x", c["vs_baseline"] <= c["target_vs_baseline"])

# mpi: the redistribute of 16 MiB S(0)->S(1) against raw MPI_Alltoallw.
if mpirun:
    for c in cases(bench("redistribute", "--sizes", "16M", "--cases", "S(0)->S(1)", "--reps", "7",
                         ranks=4)):
        if c.get("baseline") == "mpi":
            row("mpi redistribute S(0)->S(1) 16 MiB vs MPI_Alltoallw", f"{c['vs_baseline']:.2f}x",
                "<= 1.3x", c["vs_baseline"] <= 1.3)

missed = [r for r in rows if not r[3]]
print(f"{len(rows) - len(missed)} of {len(rows)} figures meet their targets "
      f"({time.monotonic() - start:.0f} s)")
for f in failed_to_run:
    print(f"failed to run: {f}")
sys.exit(2 if failed_to_run else 1 if missed else 0)
