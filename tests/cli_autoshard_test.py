"""`meshflow autoshard` and `train --auto` on the examples: for the GPT and the MLP on 4 devices and
on 2x2, the chosen estimate is no worse than any hand-written layout's (each priced by `explain
--json` with the same options), the written file's estimate is the one reported, and it trains
equal to one device (`--check`), also from another folder; a memory limit nothing fits gives one
line with the least memory any choice needs; a limit between the GPT's peaks with and without
activation recomputation gets a recomputing choice that fits; a limit the data-parallel layout of an AdamW model
with its inputs pinned (sharded folders) meets only with sharded optimizer state gets a ZeRO
choice that trains equal to one device. Under mpirun (--mpi MPIRUN) `train --auto --check` runs
on 4 ranks.
Usage: cli_autoshard_test.py MESHFLOW EXAMPLES_DIR [--mpi MPIRUN]"""
import json
import os
import sys
import tempfile

import numpy as np

from checks import check, finish, run_meshflow

meshflow, examples = sys.argv[1], os.path.abspath(sys.argv[2])
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
TOLERANCE = 1e-5  # float32 rounding of sums in another order
gpt = os.path.join(examples, "gpt")


def run(*args, ranks=None):
    return run_meshflow(meshflow, args, mpirun if ranks else None, ranks, timeout=240)


def json_of(what, *args):
    r = run(*args)
    check(r.returncode == 0, f"{what}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout) if r.returncode == 0 else None


def trains_equal(what, path, *extra, ranks=None, weight_tolerance=TOLERANCE):
    r = run("train", path, "--steps", "2", "--check", "--json", *extra, ranks=ranks)
    check(r.returncode == 0, f"{what}: train exit {r.returncode}: {r.stderr.strip()[-300:]}")
    if r.returncode != 0:
        return
    c = json.loads(r.stdout)["check"]
    check(c["max_loss_diff"] <= TOLERANCE, f"{what}: max_loss_diff = {c['max_loss_diff']}")
    check(c["max_weight_diff"] <= weight_tolerance,
          f"{what}: max_weight_diff = {c['max_weight_diff']}")


def estimate(path, *extra):
    out = json_of(f"explain {path}", "explain", path, "--json", *extra)
    return out["est_step_s"] if out else float("inf")


def mlp_layouts(tmp, mesh):
    """The MLP of dp_mlp.json placed by hand, one file per layout (data paths made absolute)."""
    base = json.load(open(os.path.join(examples, "dp_mlp.json")))
    for t in base["tensors"].values():
        if isinstance(t.get("input"), str):
            t["input"] = os.path.join(examples, t["input"])
    two = mesh == "2x2"
    layouts = {
        "replicated": {n: ["R", "R"] if two else ["R"] for n in base["tensors"]},
        "dp": {"x": ["S(0)", "S(0)"] if two else ["S(0)"], "y": ["S(0)", "S(0)"] if two else ["S(0)"]},
        "tp": {"w1": ["R", "S(1)"] if two else ["S(1)"], "b1": ["R", "S(0)"] if two else ["S(0)"],
               "w2": ["R", "S(0)"] if two else ["S(0)"]},
    }
    if two:
        layouts["dp_tp"] = {"x": ["S(0)", "R"], "y": ["S(0)", "R"], "w1": ["R", "S(1)"],
                            "b1": ["R", "S(0)"], "w2": ["R", "S(0)"]}
    files = {}
    for name, placements in layouts.items():
        m = json.loads(json.dumps(base))
        m["meshes"] = {"dp": mesh}
        for t, p in m["tensors"].items():
            p0 = placements.get(t, ["R", "R"] if two else ["R"])
            p["placements"] = p0
        path = os.path.join(tmp, f"mlp_{name}_{mesh}.json")
        json.dump(m, open(path, "w"))
        files[name] = path
    return files


def chosen_no_worse(what, model, mesh, hand, tmp):
    """autoshard MODEL --mesh MESH against every hand layout (ZeRO 0, 1 and 3 of each), all priced
    on the built-in description: the search leaves out the sync charge the compiler adds to each
    move the devices meet in (graph/step_time.h), so a description measured under load (a sync of
    hundreds of microseconds against these models' microsecond kernels) can let a hand layout
    with fewer such moves win."""
    out_path = os.path.join(tmp, "out", f"auto_{what}_{mesh}.json")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    r = json_of(f"autoshard {what} --mesh {mesh}", "autoshard", model, "--mesh", mesh, "--json",
                "--out", out_path, "--machine", "default")
    if r is None:
        return None
    for field in ("est_step_s", "given_est_step_s", "memory_per_device_bytes", "zero",
                  "micro_batches", "search_s", "values"):
        check(field in r, f"autoshard --json has {field}")
    for name, path in hand.items():
        for zero in ("0", "1", "3"):
            est = estimate(path, "--zero", zero, "--machine", "default")
            check(r["est_step_s"] <= est * (1 + 1e-12),
                  f"{what} on {mesh}: chosen {r['est_step_s']} > hand layout {name} zero {zero} {est}")
    # The written file prices as reported and runs as it is, from its own folder.
    again = estimate(out_path, "--machine", "default")
    check(abs(again - r["est_step_s"]) <= 1e-9 * r["est_step_s"],
          f"{what} on {mesh}: explain of the written file {again} != {r['est_step_s']}")
    trains_equal(f"{what} on {mesh}", out_path)
    return r


with tempfile.TemporaryDirectory() as tmp:
    if mpirun:
        # One launch each: the GPT and the MLP chosen and trained on 4 ranks.
        trains_equal("train --auto gpt 2x2", os.path.join(gpt, "gpt_one.json"), "--auto",
                     "--mesh", "2x2", ranks=4)
        trains_equal("train --auto mlp", os.path.join(examples, "dp_mlp.json"), "--auto",
                     ranks=4)
        finish()

    gpt_hand = {"4": ["dp", "tp", "tp_vocab", "sp"], "2x2": ["dp_tp"]}
    for mesh, names in gpt_hand.items():
        chosen_no_worse("gpt", os.path.join(gpt, "gpt_one.json"), mesh,
                        {n: os.path.join(gpt, f"gpt_{n}.json") for n in names}, tmp)
    for mesh in ("4", "2x2"):
        chosen_no_worse("mlp", os.path.join(examples, "dp_mlp.json"), mesh,
                        mlp_layouts(tmp, mesh), tmp)

    # train --auto trains the choice.
    trains_equal("train --auto", os.path.join(examples, "dp_mlp.json"), "--auto")

    # Nothing fits: one line naming the least memory any choice needs.
    r = run("autoshard", os.path.join(examples, "dp_mlp.json"), "--memory-limit", "1000")
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and "the least any choice needs is" in lines[0],
          f"nothing fits: exit {r.returncode}, {r.stderr.strip()}")
    r = run("train", os.path.join(examples, "dp_mlp.json"), "--memory-limit", "1000")
    check(r.returncode != 0 and "--memory-limit needs --auto" in r.stderr,
          f"--memory-limit without --auto: {r.stderr.strip()}")

    # Recomputation: with no limit autoshard keeps none; with a limit between the GPT's full
    # and none peaks (on its own placements) it picks a policy that fits, writes it in the
    # "train" object, and that file trains equal to one device; --recompute fixes the policy.
    one = os.path.join(gpt, "gpt_one.json")
    r = json_of("autoshard gpt", "autoshard", one, "--json")
    if r:
        check(r["recompute"] == "none", f"no limit: recompute {r['recompute']}")
    peaks = {p: (json_of(f"explain --recompute {p}", "explain", one, "--recompute", p, "--json")
                 or {}).get("memory_per_device_bytes", 0) for p in ("none", "full")}
    limit = (peaks["none"] + peaks["full"]) // 2
    out = os.path.join(tmp, "gpt_recompute.json")
    r = json_of("autoshard gpt under a limit", "autoshard", one, "--memory-limit", str(limit),
                "--json", "--out", out)
    if r:
        check(r["recompute"] in ("selective", "full") and r["memory_per_device_bytes"] <= limit,
              f"between the peaks ({peaks}, limit {limit}): {r['recompute']}, "
              f"{r['memory_per_device_bytes']} bytes")
        written = json.load(open(out))
        check(written["train"]["recompute"] == r["recompute"],
              f"the written train object: {written['train']}")
        again = json_of("explain the written file", "explain", out, "--json")
        check(again and again["recompute"] and again["memory_per_device_bytes"] <= limit,
              "the written file's explain recomputes and fits")
        trains_equal("gpt under a limit", out)
    r = json_of("autoshard --recompute full", "autoshard", one, "--recompute", "full", "--json")
    check(r is not None and r["recompute"] == "full", "--recompute fixes the policy")

    # AdamW with data-parallel inputs pinned (sharded folders): a limit below the data-parallel
    # layout's memory at ZeRO 0 is met by sharding the optimizer state.
    rng = np.random.default_rng(5)
    np.save(f"{tmp}/x.npy", rng.standard_normal((2048, 256)).astype(np.float32))
    np.save(f"{tmp}/y.npy", rng.integers(0, 16, (2048,)).astype(np.int64))
    for name in ("x", "y"):
        r = run("shard", "--in", f"{tmp}/{name}.npy", "--mesh", "4", "--placements", "S(0)",
                "--out", f"{tmp}/{name}4", "--quiet")
        check(r.returncode == 0, f"shard {name}: {r.stderr.strip()}")
    model = {"meshes": {"dp": "4"}, "tensors": {
        "x": {"shape": [2048, 256], "input": "x4", "mesh": "dp", "placements": ["S(0)"]},
        "y": {"shape": [2048], "dtype": "int64", "input": "y4", "mesh": "dp", "placements": ["S(0)"]},
        "w1": {"shape": [256, 512], "weight": {"normal": 0.05, "seed": 1}, "mesh": "dp",
               "placements": ["R"]},
        "w2": {"shape": [512, 16], "weight": {"normal": 0.05, "seed": 2}, "mesh": "dp",
               "placements": ["R"]}},
        "nodes": [{"name": "h", "op": "linear", "inputs": ["x", "w1"]},
                  {"name": "a", "op": "gelu", "inputs": ["h"]},
                  {"name": "o", "op": "linear", "inputs": ["a", "w2"]},
                  {"name": "loss", "op": "softmax_cross_entropy", "inputs": ["o", "y"]}],
        "loss": "loss", "outputs": ["loss"]}
    path = f"{tmp}/adamw_dp.json"
    json.dump(model, open(path, "w"))
    own = json_of("explain adamw dp", "explain", path, "--optimizer", "adamw", "--json")
    if own:
        limit = own["memory_per_device_bytes"] - 1
        out = f"{tmp}/adamw_auto.json"
        r = json_of("autoshard adamw under a limit", "autoshard", path, "--optimizer", "adamw",
                    "--memory-limit", str(limit), "--json", "--out", out)
        if r:
            check(r["zero"] in (1, 3), f"adamw under a limit: zero {r['zero']}")
            check(r["memory_per_device_bytes"] <= limit,
                  f"adamw under a limit: {r['memory_per_device_bytes']} > {limit}")
            check(r["values"]["x"]["placements"] == ["S(0)"], "the pinned input keeps its layout")
            # AdamW moves each weight by about lr at its first steps whatever the gradient's
            # size: with tests/cli_model_test.py's options and tolerance (a hundredth of lr).
            trains_equal("adamw under a limit", out, "--optimizer", "adamw", "--lr", "0.01",
                         "--clip-grad-norm", "0.1", "--warmup-steps", "1",
                         weight_tolerance=1e-2 * 0.01)
finish()
