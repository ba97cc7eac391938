"""`meshflow data prepare|encode|decode` (DESIGN.md's tokenizer bullet): the splits hold the
documents and tokens DESIGN names, the bpe ids equal Python sentencepiece's for the same model
file, and text round-trips through encode and decode under both tokenizers.
Usage: cli_tokenizer_test.py MESHFLOW"""
import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from checks import check, finish

meshflow = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="meshflow_tokenizer_test_")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # however the script ends


def run(*args, stdin=b""):
    return subprocess.run([meshflow, *args], input=stdin, capture_output=True, timeout=300)


def fortunes(seed, docs):
    """Text of `docs` documents, each ending in a "%" line, with spaces, runs of spaces,
    leading spaces, empty lines and multi-byte characters."""
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "mat", "caf\u00e9", "\u20ac", "\U0001f642", "\u4e2d\u6587",
             "Q:", "A:", "  ", "why?"]
    out = []
    for _ in range(docs):
        for _ in range(rng.randint(1, 3)):
            line = " ".join(rng.choice(words) for _ in range(rng.randint(0, 9)))
            out.append((" " if rng.random() < 0.2 else "") + line)
        out.append("%")
    return "\n".join(out) + "\n"


text = fortunes(59, 400)
a, b = os.path.join(tmp, "a.txt"), os.path.join(tmp, "b.txt")
half = len(text) // 2
half = text.index("%\n", half) + 2  # the second file starts a document
with open(a, "w", encoding="utf-8") as f:
    f.write(text[:half])
with open(b, "w", encoding="utf-8") as f:
    f.write(text[half:])
raw = text.encode("utf-8")
docs = [d + b"%\n" for d in raw.split(b"%\n")[:-1]]
check(b"".join(docs) == raw, "the test's documents rebuild the text")

for tokenizer in ("bytes", "bpe"):
    out = os.path.join(tmp, tokenizer)
    r = run("data", "prepare", "--text", a, b, "--out", out, "--tokenizer", tokenizer,
            "--vocab-size", "320", "--separator", "%", "--val-fraction", "0.1")
    check(r.returncode == 0, f"prepare {tokenizer}: {r.stderr.decode()}")
    if r.returncode != 0:
        continue
    meta = json.load(open(os.path.join(out, "tokenizer.json")))
    train, val = np.load(os.path.join(out, "train.npy")), np.load(os.path.join(out, "val.npy"))
    check(train.dtype == np.uint16 and val.dtype == np.uint16, f"{tokenizer}: dtype {train.dtype}")
    line = r.stdout.decode().strip()
    check(line.startswith(f"train: {len(train)} tokens, val: {len(val)} tokens, ")
          and line.endswith("bytes per token"), f"{tokenizer}: printed {line}")
    if tokenizer == "bytes":
        check(meta == {"kind": "bytes", "vocab_size": 256, "model": None}, f"bytes meta {meta}")
        encode = list
    else:
        import sentencepiece
        check(meta == {"kind": "bpe", "vocab_size": 320, "model": "tokenizer.model"},
              f"bpe meta {meta}")
        sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, "tokenizer.model"))

        def encode(d):
            return sp.encode(d.decode("utf-8"))
    # Documents 10, 20, 30, ... (1-based) are val; each document encoded on its own.
    want_train = [t for k, d in enumerate(docs, 1) if k % 10 for t in encode(d)]
    want_val = [t for k, d in enumerate(docs, 1) if k % 10 == 0 for t in encode(d)]
    check(train.tolist() == want_train, f"{tokenizer}: train differs from the reference's ids")
    check(val.tolist() == want_val, f"{tokenizer}: val differs from the reference's ids")
    # Round trips through the command line, adversarial texts included.
    samples = ["", "\n\n", "   leading", "runs    of  spaces\t\n", "caf\u00e9 \U0001f642 \u20ac",
               fortunes(7, 3)]
    for s in samples:
        ids = run("data", "encode", "--tokenizer", out, stdin=s.encode("utf-8"))
        back = run("data", "decode", "--tokenizer", out, stdin=ids.stdout)
        check(back.stdout == s.encode("utf-8"), f"{tokenizer}: {s!r} came back as {back.stdout!r}")
        if tokenizer == "bpe":
            check([int(x) for x in ids.stdout.split()] == sp.encode(s),
                  f"bpe: {s!r} encodes unlike sentencepiece")
    bad = run("data", "decode", "--tokenizer", out, stdin=b"1 2 99999")
    check(bad.returncode == 1 and b"id 99999 is outside the vocabulary" in bad.stderr,
          f"{tokenizer}: a bad id: {bad.stderr!r}")

# Invalid UTF-8 round-trips under bytes.
junk = bytes(range(256)) + b"\xc3\x28\xff"
ids = run("data", "encode", "--tokenizer", os.path.join(tmp, "bytes"), stdin=junk)
back = run("data", "decode", "--tokenizer", os.path.join(tmp, "bytes"), stdin=ids.stdout)
check(back.stdout == junk, "bytes: invalid UTF-8 does not round-trip")

# Without a separator, the last floor(F * N) tokens are val.
out = os.path.join(tmp, "tail")
r = run("data", "prepare", "--text", a, "--out", out, "--val-fraction", "0.25")
check(r.returncode == 0, f"prepare without separator: {r.stderr.decode()}")
if r.returncode == 0:
    n = len(text[:half].encode("utf-8"))
    val = np.load(os.path.join(out, "val.npy"))
    check(len(val) == n // 4 and bytes(val.astype(np.uint8)) == text[:half].encode()[n - n // 4:],
          "the last quarter of the tokens is val")

# Bad options: one line, exit 1, no folder.
for args, needle in ((["--val-fraction", "1.5"], "--val-fraction 1.5"),
                     (["--tokenizer", "bpe", "--vocab-size", "5"], "--vocab-size 5"),
                     (["--text", os.path.join(tmp, "missing.txt")], "missing.txt")):
    out = os.path.join(tmp, "bad")
    base = ["data", "prepare", "--out", out]
    if "--text" not in args:
        base += ["--text", a]
    r = run(*base, *args)
    lines = r.stderr.decode().strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and needle in lines[0] and not os.path.exists(out),
          f"prepare {args}: rc {r.returncode}: {r.stderr.decode()}")
finish()
