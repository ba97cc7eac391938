"""Runs a `meshflow bench ... --json` command (the arguments after this script) and checks that it
prints one object in the benchmark format of docs/contract.md. Exits non-zero otherwise."""
import json
import subprocess
import sys

out = subprocess.run(sys.argv[1:], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"benchmark failed ({out.returncode}): {out.stderr}")
report = json.loads(out.stdout)
assert set(report) >= {"benchmark", "memcpy_gbps", "results"}, report.keys()
assert report["memcpy_gbps"] > 0
assert report["results"], "no results"
for r in report["results"]:
    for key in ("case", "backend", "mesh", "devices", "bytes", "median_s", "min_s", "max_s", "floor_s",
                "vs_floor", "baseline", "vs_baseline"):
        assert key in r, f"result lacks {key}: {r}"
    assert r["min_s"] <= r["median_s"] <= r["max_s"], r
    if r["floor_s"] is not None:
        assert abs(r["vs_floor"] - r["median_s"] / r["floor_s"]) < 1e-9 * max(1, r["vs_floor"]), r
    # A count the benchmark states against its analytic value must equal it.
    assert r.get("block_matches_analytic", True) is True, r
print(f"{report['benchmark']}: {len(report['results'])} results in the contract's format")
