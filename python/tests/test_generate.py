"""Model.generate (docs/generate.md): text and id prompts, the KV cache against the whole
context, --stop, and one-line errors."""

import os
import pathlib
import tempfile

import pytest

import meshflow as mf

GPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models" / "gpt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The example GPT (vocabulary 32, context 8) trained a few steps, checkpointed."""
    ck = tmp_path_factory.mktemp("ck")
    # Under mpirun every rank must name the same folder: one per job (Open MPI's PMIx namespace).
    job = os.environ.get("PMIX_NAMESPACE")
    if job:
        ck = pathlib.Path(tempfile.gettempdir()) / f"meshflow_generate_test_{job}"
    m = mf.Model.load(GPT / "gpt_tp_data.json")
    m.train(6, optimizer="adamw", lr=0.01, checkpoint=ck)
    return m, ck


def test_the_cache_equals_the_whole_context_and_layouts_agree(trained):
    m, ck = trained
    cached = m.generate(ck, [3, 1], max_new_tokens=6, num_samples=2, temperature=0)
    whole = m.generate(ck, [3, 1], max_new_tokens=6, num_samples=2, temperature=0, cache=False)
    assert [s["tokens"] for s in cached["samples"]] == [s["tokens"] for s in whole["samples"]]
    for a, b in zip(cached["samples"], whole["samples"]):
        assert len(a["tokens"]) == 6 and a["text"] is None
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4
    assert cached["prompt_tokens"] == [3, 1]
    # Another layout of the same model, reading the same checkpoint: the same seeded samples.
    dp = mf.Model.load(GPT / "gpt_dp_data.json")
    a = m.generate(ck, [5], max_new_tokens=7, num_samples=3, seed=9)
    b = dp.generate(ck, [5], max_new_tokens=7, num_samples=3, seed=9)
    assert [s["tokens"] for s in a["samples"]] == [s["tokens"] for s in b["samples"]]


def test_text_prompts_and_stop(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\n%\nthe dog sat on the log\n%\n" * 40, encoding="utf-8")
    mf.data.prepare(text, tmp_path / "tok", separator="%")
    # A byte-level model of context 8 over a vocabulary of 256: its initial weights, saved.
    m = mf.Model.load(GPT / "gpt_one_data.json")
    with pytest.raises(Exception, match="--tokenizer: its vocabulary of 256 ids is larger"):
        m.generate(tmp_path, "the", max_new_tokens=3, tokenizer=tmp_path / "tok")
    with pytest.raises(Exception, match="prompt= is text but no tokenizer="):
        m.generate(tmp_path, "the", max_new_tokens=3)


def test_errors_are_one_line(trained):
    m, ck = trained
    with pytest.raises(Exception, match="--max-new-tokens 9"):
        m.generate(ck, [1], max_new_tokens=9)
    with pytest.raises(Exception, match="--top-p 2"):
        m.generate(ck, [1], max_new_tokens=2, top_p=2)
    with pytest.raises(Exception, match="--prompt is empty"):
        m.generate(ck, [], max_new_tokens=2)
    with pytest.raises(Exception, match="stop= holds an empty string"):
        m.generate(ck, [1], max_new_tokens=2, stop="")
    with pytest.raises(Exception, match="timeout= 0"):
        m.train(1, timeout=0)


def test_stop_ends_a_sample(trained):
    m, ck = trained
    full = m.generate(ck, [3], max_new_tokens=7, temperature=0)["samples"][0]["tokens"]
    # Without a tokenizer the text is the ids: stop at the first generated id.
    stopped = m.generate(ck, [3], max_new_tokens=7, temperature=0, stop=str(full[0]))
    assert stopped["samples"][0]["tokens"] == full[:1]
