"""Model.train over datasets and meshflow.data.batches (docs/data.md)."""

import json
import pathlib

import numpy as np

import meshflow as mf

GPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models" / "gpt"


def test_batches_are_windows_of_the_stream_shifted_by_one():
    got = mf.data.batches(GPT / "gpt_dp_data.json", steps=(1, 3))
    stream = np.load(GPT / "data" / "train.npy").astype(np.int64)
    assert len(got) == 3
    for batch in got:
        assert batch["tokens"].shape == (4, 8) and batch["next"].shape == (4, 8)
        # The next tokens are the tokens shifted by one, and every row is a window at a unit.
        assert np.array_equal(batch["next"][:, :-1], batch["tokens"][:, 1:])
        windows = stream[:len(stream) - 1 - (len(stream) - 1) % 8].reshape(-1, 8)
        for row in batch["tokens"]:
            assert np.any(np.all(windows == row, axis=1))
    val = mf.data.batches(mf.Model.load(GPT / "gpt_dp_data.json"), steps=(1, 1), split="val")
    val_stream = np.load(GPT / "data" / "val.npy").astype(np.int64)
    assert np.array_equal(val[0]["tokens"], val_stream[:32].reshape(4, 8))


def test_train_evaluates_and_logs(tmp_path):
    m = mf.Model.load(GPT / "gpt_dp_data.json")
    r = m.train(3, check=True, eval_every=2, eval_batches=2, log_dir=tmp_path / "logs")
    assert [e["step"] for e in r["evals"]] == [2, 3]
    assert r["check"]["max_val_loss_diff"] < 1e-5
    assert r["steps"][0]["tokens_per_s"] > 0 and r["steps"][0]["grad_norm"] > 0
    log = tmp_path / "logs" / "metrics.jsonl"
    if log.exists():  # under mpi, device 0's process writes it (in its own tmp_path)
        lines = log.read_text().splitlines()
        assert len([l for l in lines if "val_loss" in json.loads(l)]) == 2


def test_prepare_encode_decode_round_trip(tmp_path):
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(59)
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 6))) for _ in range(200)]
    docs = [" ".join(rng.choice(words, size=8)) + " caf\u00e9  \u20ac\n%\n" for _ in range(30)]
    text.write_text("".join(docs), encoding="utf-8")
    for kind in ("bytes", "bpe"):
        out = tmp_path / kind
        r = mf.data.prepare(text, out, tokenizer=kind, vocab_size=300, separator="%",
                            val_fraction=0.34)
        assert r["train_tokens"] > 0 and r["val_tokens"] > 0
        for s in ["", "   x", "caf\u00e9  \u20ac\n\n"]:
            assert mf.data.decode(mf.data.encode(s, out), out) == s
    assert mf.data.decode(mf.data.encode(b"\xff\xfe", tmp_path / "bytes"),
                          tmp_path / "bytes") == b"\xff\xfe"
