"""`meshflow generate` (DESIGN.md "Generation"): greedy generation with the KV cache equals
--no-cache token for token (logprobs within 1e-4) on every GPT layout, seeded sampling gives the
same tokens on every layout, checkpoints and --save folders in any layout are read, the sampling
rules (top-k 1, tiny top-p, seeds, --stop), streamed text that is valid UTF-8 at every read, and
every error of DESIGN's list as one line, exit 1, no token printed. Under --mpi the tp, dp_tp and
pp layouts run under mpirun -n 4 and must give the threads backend's tokens.
Usage: cli_generate_test.py MESHFLOW EXAMPLES [--mpi MPIRUN]"""
import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from checks import check, finish, run_meshflow

meshflow, examples = sys.argv[1], sys.argv[2]
mpirun = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--mpi" else None
tmp = tempfile.mkdtemp(prefix="meshflow_generate_test_")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # however the script ends


def run(*args, ranks=None, timeout=300):
    return run_meshflow(meshflow, list(args), mpirun=mpirun, ranks=ranks, timeout=timeout)


def must(r, what):
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"{what} failed: {r.stderr.strip()}")
    return r


# A byte-level corpus of short documents with multi-byte characters, prepared and trained on.
rng = random.Random(59)
words = ["the", "cat", "sat", "on", "a", "mat", "caf\u00e9", "\u20ac5", "\u4e2d\u6587", "na\u00efve",
         "and", "\u00fcber", "dog"]
lines = []
for _ in range(600):
    lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))))
    lines.append("%")
corpus = os.path.join(tmp, "corpus")
with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
data = os.path.join(tmp, "data")
must(run("data", "prepare", "--text", corpus, "--out", data, "--separator", "%"), "prepare")
models = os.path.join(tmp, "gpt")
must(subprocess.run(["/usr/bin/python3", os.path.join(examples, "gpt", "make_gpt.py"), models,
                     "--vocab", "256", "--seq", "64", "--dim", "32", "--heads", "4", "--blocks", "2",
                     "--batch", "8", "--devices", "4", "--data", data, "--init", "gpt2"],
                    capture_output=True, text=True), "make_gpt")


def model(layout):
    return os.path.join(models, f"gpt_{layout}.json")


weights, ckpt = os.path.join(tmp, "w"), os.path.join(tmp, "ck")
must(run("train", model("tp"), "--steps", "40", "--optimizer", "adamw", "--lr", "0.01",
         "--save", weights, "--checkpoint", ckpt, "--checkpoint-every", "20", "--backend", "threads"),
     "train tp")
pp_weights = os.path.join(tmp, "wpp")
must(run("train", model("pp"), "--steps", "10", "--optimizer", "adamw", "--lr", "0.01",
         "--save", pp_weights, "--backend", "threads"), "train pp")


def generate(layout, *args, w=weights, ranks=None, tokenizer=True):
    extra = ["--tokenizer", data] if tokenizer else []
    backend = [] if ranks else ["--backend", "threads"]
    r = run("generate", model(layout), "--weights", w, *extra, *args, "--json", *backend, ranks=ranks)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def same(a, b, what):
    """Equal tokens, and logprobs within 1e-4, sample by sample."""
    if a is None or b is None:
        check(False, f"{what}: a run failed")
        return
    for i, (x, y) in enumerate(zip(a["samples"], b["samples"])):
        check(x["tokens"] == y["tokens"], f"{what}: sample {i}: {x['tokens']} vs {y['tokens']}")
        check(all(abs(p - q) <= 1e-4 for p, q in zip(x["logprobs"], y["logprobs"])),
              f"{what}: sample {i}: logprobs {x['logprobs'][:4]} vs {y['logprobs'][:4]}")
    check(len(a["samples"]) == len(b["samples"]), f"{what}: sample counts")


greedy = ["--prompt", "the caf", "--temperature", "0", "--num-samples", "2", "--max-new-tokens", "24"]
# The model and seed are chosen so that no draw falls within rounding of a boundary between two
# candidates (the tokens then agree on every layout, as the checks below require).
seeded = ["--prompt", "a ", "--seed", "7", "--num-samples", "3", "--max-new-tokens", "24"]
reference, err = generate("one", *greedy, "--no-cache")
check(reference is not None and len(reference["samples"][0]["tokens"]) == 24, f"reference: {err}")
sampled, err = generate("one", *seeded)
check(sampled is not None, f"seeded reference: {err}")
pp_reference, err = generate("pp", *greedy, "--no-cache", w=pp_weights)
check(pp_reference is not None, f"pp reference: {err}")
pp_sampled, _ = generate("pp", *seeded, w=pp_weights)

if not mpirun:
    for layout in ("one", "dp", "tp", "tp_vocab", "sp", "dp_tp"):
        for cache in ([], ["--no-cache"]):
            got, err = generate(layout, *greedy, *cache)
            same(got, reference, f"greedy {layout} {cache or 'cached'} {err}")
        got, err = generate(layout, *seeded)
        same(got, sampled, f"seeded {layout} {err}")
    got, err = generate("pp", *greedy, w=pp_weights)
    same(got, pp_reference, f"greedy pp cached {err}")
    # Checkpoints: the newest of a folder, or a step, in the layout it was saved in.
    got, err = generate("dp", *greedy, w=ckpt)
    same(got, reference, f"the checkpoint folder (step 40) {err}")
    step20, err = generate("dp", *greedy, w=os.path.join(ckpt, "step-20"))
    check(step20 is not None and step20["samples"][0]["logprobs"] != reference["samples"][0]["logprobs"],
          f"--weights ck/step-20 reads step 20: {err}")

    # Sampling rules.
    greedy_one = ["--prompt", "the ", "--max-new-tokens", "30"]
    base, _ = generate("tp", *greedy_one, "--temperature", "0")
    topk, _ = generate("tp", *greedy_one, "--top-k", "1", "--seed", "3")
    topp, _ = generate("tp", *greedy_one, "--top-p", "1e-9", "--seed", "4", "--temperature", "1.5")
    check(topk["samples"][0]["tokens"] == base["samples"][0]["tokens"], "top-k 1 is greedy")
    check(topp["samples"][0]["tokens"] == base["samples"][0]["tokens"], "a tiny top-p is greedy")
    long = ["--prompt", "the ", "--max-new-tokens", "50", "--temperature", "1"]
    tokens = {s: generate("one", *long, "--seed", str(s))[0]["samples"][0]["tokens"] for s in range(1, 7)}
    again = generate("one", *long, "--seed", "1")[0]["samples"][0]["tokens"]
    check(again == tokens[1], "a fixed seed repeats")
    check(any(tokens[a] != tokens[a + 1] for a in (1, 3, 5)), "of three pairs of seeds, one differs")

    # --stop: the sample ends once its text ends with the string.
    full, _ = generate("one", "--prompt", "the ", "--max-new-tokens", "40", "--temperature", "0")
    text = full["samples"][0]["text"]
    stop = text[6:9]
    stopped, err = generate("one", "--prompt", "the ", "--max-new-tokens", "40", "--temperature",
                            "0", "--stop", stop)
    want = text[: text.index(stop) + len(stop)]
    check(stopped is not None and stopped["samples"][0]["text"] == want,
          f"--stop {stop!r}: {stopped and stopped['samples'][0]['text']!r} vs {want!r} {err}")

    # Streamed text: every read is whole UTF-8, and multi-byte characters come through.
    p = subprocess.Popen([meshflow, "generate", model("one"), "--weights", weights, "--tokenizer",
                          data, "--prompt", "caf\u00e9 \u4e2d", "--max-new-tokens", "50", "--seed",
                          "11", "--num-samples", "2", "--backend", "threads"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks = []
    while True:
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            break
        chunks.append(chunk)
    p.wait(timeout=120)
    check(p.returncode == 0, f"streamed generate: {p.stderr.read().decode()}")
    bad = []
    for c in chunks:
        try:
            c.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(c)
    out = b"".join(chunks).decode("utf-8", errors="replace")
    check(not bad, f"every read of the stream is valid UTF-8: {bad[:2]}")
    check(out.startswith("caf\u00e9 \u4e2d") and "\n---\ncaf\u00e9 \u4e2d" in out,
          f"the prompt and the samples, separated by ---: {out[:80]!r}")
    check(any(ord(ch) > 127 for ch in out.split("\n---\n")[0][len("caf\u00e9 \u4e2d"):]),
          "the continuation holds multi-byte characters")

# Every error: one line, exit 1, no token printed.
bpe = os.path.join(tmp, "bpe")
must(run("data", "prepare", "--text", corpus, "--out", bpe, "--tokenizer", "bpe", "--vocab-size",
         "300"), "prepare bpe")
shape_weights = os.path.join(tmp, "w_shape")
must(run("train", os.path.join(examples, "gpt", "gpt_tp_data.json"), "--steps", "1", "--save",
         shape_weights, "--backend", "threads"), "train the small example")
errors = [
    (["--prompt", ""], "--prompt is empty"),
    (["--prompt", "3 256", "--no-tokenizer"], "token 256 is outside the vocabulary of 256"),
    (["--prompt", "the", "--max-new-tokens", "62"], "--max-new-tokens 62"),
    (["--prompt", "the", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["--prompt", "the", "--num-samples", "0"], "--num-samples 0"),
    (["--prompt", "the", "--temperature", "-1"], "--temperature -1"),
    (["--prompt", "the", "--top-k", "0"], "--top-k 0"),
    (["--prompt", "the", "--top-p", "0"], "--top-p 0"),
    (["--prompt", "the", "--top-p", "1.5"], "--top-p 1.5"),
    (["--prompt", "the", "--stop", ""], "--stop is empty"),
    (["--prompt", "the", "--max-new-tokens", "9", "--weights", os.path.join(tmp, "none")], "no tensor"),
    (["--prompt", "the", "--max-new-tokens", "9", "--weights", shape_weights], "but the model says"),
    (["--prompt", "the", "--tokenizer", bpe], "--tokenizer: its vocabulary of 300 ids"),
    (["--prompt", "3 4", "--no-tokenizer", "--model", os.path.join(examples, "gpt", "gpt_one.json")],
     "\"generate\" object"),
]
for args, want in errors:
    m, w, tok = model("tp"), weights, ["--tokenizer", data]
    args = list(args)
    if "--no-tokenizer" in args:
        args.remove("--no-tokenizer")
        tok = []
    if "--model" in args:
        i = args.index("--model")
        m = args[i + 1]
        del args[i:i + 2]
    if "--weights" in args:
        i = args.index("--weights")
        w = args[i + 1]
        del args[i:i + 2]
    if "--tokenizer" in args:
        tok = []
    r = run("generate", m, "--weights", w, *tok, *args, ranks=4 if mpirun else None)
    # Under mpirun, Open MPI adds its own lines about the exit status after meshflow's one.
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("meshflow:") or not mpirun]
    check(r.returncode == 1 and len(lines) == 1 and want in lines[0] and r.stdout == "",
          f"{args}: exit {r.returncode}, stdout {r.stdout[:60]!r}, stderr {r.stderr.strip()!r}, want {want!r}")

if mpirun:
    for layout in ("tp", "dp_tp"):
        got, err = generate(layout, *greedy, ranks=4)
        same(got, reference, f"mpi greedy {layout} {err}")
        got, err = generate(layout, *seeded, ranks=4)
        same(got, sampled, f"mpi seeded {layout} {err}")
    got, err = generate("pp", *greedy, w=pp_weights, ranks=4)
    same(got, pp_reference, f"mpi greedy pp {err}")
    got, err = generate("pp", *seeded, w=pp_weights, ranks=4)
    same(got, pp_sampled, f"mpi seeded pp {err}")

finish()
