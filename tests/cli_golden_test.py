"""Golden text of the command line: every `--help`, `--version`, and the exit status and one-line
message for each class of bad value. The binary's path is written as `meshflow`. After an
intended change, regenerate with `cli_golden_test.py MESHFLOW --update` and review the diff.
Usage: cli_golden_test.py MESHFLOW [--update]"""
import os
import re
import subprocess
import sys
import tempfile

meshflow = sys.argv[1]
update = "--update" in sys.argv
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_golden")
models = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                      "models")

HELP = [[], ["shard"], ["gather"], ["plan"], ["redistribute"], ["run"], ["train"], ["explain"],
        ["bench"], ["bench", "copy"], ["bench", "collectives"], ["bench", "redistribute"],
        ["bench", "io"], ["bench", "ops"], ["bench", "train"], ["bench", "overlap"], ["generate"],
        ["launch"]]

# (what, args) for each class of bad value; {tmp} is a scratch folder holding x.npy (13x6 float32)
# and a sharded folder `a` (2x2, S(0),S(1)).
ERRORS = [
    ("unknown command", ["shardd"]),
    ("unknown option", ["plan", "--mesh", "4", "--shape", "8", "--from", "R", "--to", "R", "--colour"]),
    ("missing option", ["plan", "--mesh", "4", "--shape", "8", "--from", "R"]),
    ("malformed mesh", ["plan", "--mesh", "2y2", "--shape", "8", "--from", "R", "--to", "R"]),
    ("placements for another mesh", ["redistribute", "--in", "{tmp}/a", "--to", "R,S(1),R", "--out", "{tmp}/b"]),
    ("shard dim out of range", ["plan", "--mesh", "4", "--shape", "8", "--from", "S(1)", "--to", "R"]),
    ("malformed placement", ["plan", "--mesh", "4", "--shape", "8", "--from", "Q(0)", "--to", "R"]),
    ("shard to partial", ["plan", "--mesh", "4", "--shape", "8", "--from", "S(0)", "--to", "P(sum)"]),
    ("partial ops differ", ["plan", "--mesh", "4", "--shape", "8", "--from", "P(max)", "--to", "P(sum)"]),
    ("unknown dtype", ["plan", "--mesh", "4", "--shape", "8", "--dtype", "bfloat16", "--from", "R", "--to", "R"]),
    ("integer average", ["plan", "--mesh", "4", "--shape", "8", "--dtype", "int32", "--from", "P(avg)", "--to", "R"]),
    ("shape too large", ["plan", "--mesh", "4", "--shape", "9223372036854775807", "--from", "S(0)", "--to", "R"]),
    ("mesh too large", ["plan", "--mesh", "4294967296", "--shape", "4", "--from", "R", "--to", "R"]),
    ("too many device threads", ["redistribute", "--in", "{tmp}/a", "--to", "S(0)", "--to-mesh", "600", "--out", "{tmp}/b"]),
    ("unknown backend", ["redistribute", "--in", "{tmp}/a", "--to", "R,R", "--out", "{tmp}/b", "--backend", "nccl"]),
    ("missing file", ["shard", "--in", "{tmp}/nothing.npy", "--mesh", "2", "--placements", "R", "--out", "{tmp}/b"]),
    ("not a .npy file", ["shard", "--in", "{tmp}/a/layout.json", "--mesh", "2", "--placements", "R", "--out", "{tmp}/b"]),
    ("not a sharded folder", ["gather", "--in", "{tmp}", "--out", "{tmp}/y.npy"]),
    ("output over a file", ["shard", "--in", "{tmp}/x.npy", "--mesh", "2", "--placements", "R", "--out", "{tmp}/x.npy"]),
    ("malformed size", ["bench", "collectives", "--sizes", "16Q"]),
    ("unknown bench model", ["bench", "autoshard", "--models", "gtp"]),
    ("model file missing", ["train", "{tmp}/nothing.json"]),
    ("model file not JSON", ["explain", "{tmp}/a/rank0.npy"]),
    ("training steps out of range", ["train", "{tmp}/nothing.json", "--steps", "0"]),
    ("learning rate not a number", ["train", "{models}/tp_mlp.json", "--lr", "nan"]),
    ("learning rate negative", ["train", "{models}/tp_mlp.json", "--lr", "-1"]),
    ("learning rate not numeric", ["train", "{models}/tp_mlp.json", "--lr", "fast"]),
    ("unknown optimizer", ["train", "{models}/tp_mlp.json", "--optimizer", "adam"]),
    ("momentum out of range", ["train", "{models}/tp_mlp.json", "--momentum", "1"]),
    ("beta out of range", ["train", "{models}/tp_mlp.json", "--optimizer", "adamw", "--betas", "0.9,1.5"]),
    ("betas malformed", ["train", "{models}/tp_mlp.json", "--optimizer", "adamw", "--betas", "0.9"]),
    ("eps zero", ["explain", "{models}/tp_mlp.json", "--optimizer", "adamw", "--eps", "0"]),
    ("weight decay negative", ["train", "{models}/tp_mlp.json", "--optimizer", "adamw", "--weight-decay", "-0.1"]),
    ("clip norm zero", ["train", "{models}/tp_mlp.json", "--clip-grad-norm", "0"]),
    ("warmup negative", ["train", "{models}/tp_mlp.json", "--warmup-steps", "-2"]),
    ("decay without steps", ["train", "{models}/tp_mlp.json", "--decay", "cosine"]),
    ("decay steps zero", ["train", "{models}/tp_mlp.json", "--decay", "linear", "--decay-steps", "0"]),
    ("unknown decay", ["train", "{models}/tp_mlp.json", "--decay", "exponential", "--decay-steps", "3"]),
    ("momentum with adamw", ["train", "{models}/tp_mlp.json", "--optimizer", "adamw", "--momentum", "0.9"]),
    ("betas with sgd", ["train", "{models}/tp_mlp.json", "--betas", "0.9,0.99"]),
    ("eps with sgd", ["train", "{models}/tp_mlp.json", "--eps", "1e-6"]),
    ("micro-batches that do not divide the batch", ["train", "{models}/tp_mlp.json", "--micro-batches", "3"]),
    ("micro-batches zero", ["train", "{models}/tp_mlp.json", "--micro-batches", "0"]),
    ("threads per device zero",
     ["train", "{models}/tp_mlp.json", "--threads-per-device", "0"]),
    ("a non-finite loss", ["train", "{models}/tp_mlp.json", "--lr", "1e30", "--steps", "4", "--save", "{tmp}/never"]),
]

# Plans on 65,536 devices, step for step (the totals over devices are summed by classes of
# devices, not device by device: these files were written device by device).
PLANS = [
    ("partial_and_shards", ["plan", "--mesh", "16x16x16x16", "--shape", "4096x4096x64",
                            "--from", "S(0),P(sum),R,S(1)", "--to", "R,S(1),S(0),R"]),
    ("shards_trade_dims", ["plan", "--mesh", "16x16x16x16", "--shape", "4096x4096",
                           "--from", "S(0),S(1),R,R", "--to", "R,R,S(1),S(0)"]),
    ("partial_to_shards", ["plan", "--mesh", "16x16x16x16", "--shape", "4096x4096",
                           "--from", "P(sum),R,R,S(0)", "--to", "S(0),S(1),P(sum),R"]),
    ("uneven_on_6x5x7", ["plan", "--mesh", "6x5x7", "--shape", "13x11x9",
                         "--from", "S(0),S(2),P(sum)", "--to", "S(2),R,S(0)"]),
]


def run(args, tmp):
    args = [a.replace("{tmp}", tmp).replace("{models}", models) for a in args]
    r = subprocess.run([meshflow, *args], capture_output=True, text=True, timeout=60)
    clean = lambda s: s.replace(meshflow, "meshflow").replace(tmp, "TMP")
    # Training's progress lines (timings) are not the error.
    err = "".join(l for l in r.stderr.splitlines(keepends=True) if not re.match(r"step \d+/\d+ \[", l))
    return r.returncode, clean(r.stdout), clean(err)


failures = checked = 0


def compare(name, got):
    global failures, checked
    path = os.path.join(here, name)
    checked += 1
    if update:
        with open(path, "w") as f:
            f.write(got)
        return
    want = open(path).read() if os.path.exists(path) else None
    if got != want:
        failures += 1
        print(f"FAILED: {name} differs from its golden file:\n--- got\n{got}--- want\n{want}")


with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(["/usr/bin/python3", "-c", "import numpy as np, sys; np.save(sys.argv[1], "
                    "np.arange(78, dtype=np.float32).reshape(13, 6))", f"{tmp}/x.npy"], check=True)
    subprocess.run([meshflow, "shard", "--in", f"{tmp}/x.npy", "--mesh", "2x2", "--placements", "S(0),S(1)",
                    "--out", f"{tmp}/a", "--quiet"], check=True)
    for args in HELP:
        code, out, err = run([*args, "--help"], tmp)
        compare("help_" + ("_".join(args) or "meshflow") + ".txt", f"exit {code}\n{out}{err}")
    code, out, err = run(["--version"], tmp)
    compare("version.txt", f"exit {code}\n{out}{err}")
    for name, args in PLANS:
        code, out, err = run(args, tmp)
        compare(f"plan_{name}.txt", f"exit {code}\n{out}{err}")
    lines = ""
    for what, args in ERRORS:
        code, out, err = run(args, tmp)
        lines += f"{what}: exit {code}: {err}"
    compare("errors.txt", lines)
    # A failed run writes nothing: no --save folder in place of a good one.
    if os.path.exists(f"{tmp}/never"):
        failures += 1
        print("FAILED: the non-finite run wrote its --save folder")
print(f"{checked - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
