"""Model files from Python: run, train with check, explain."""

import pathlib

import numpy as np

import meshflow as mf

MODELS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"


def test_train_matches_one_device():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    r = m.train(3, lr=0.05, check=True)
    assert [s["step"] for s in r["steps"]] == [1, 2, 3]
    assert all(np.isfinite(s["loss"]) for s in r["steps"])
    assert r["check"]["max_loss_diff"] < 1e-4 and r["check"]["max_weight_diff"] < 1e-4


def test_run_returns_full_outputs():
    out = mf.Model.load(MODELS / "dp_tp_mlp.json").run()
    assert set(out) == {"r", "loss"}
    assert out["r"].shape == (64, 10) and out["loss"].shape == ()
    assert np.all(np.isfinite(out["r"]))
    again = mf.Model.load(MODELS / "dp_tp_mlp.json").run(overlap=True)
    assert np.allclose(again["r"], out["r"], rtol=1e-5, atol=1e-6)


def test_explain_lists_moves():
    e = mf.Model.load(MODELS / "dp_tp_mlp.json").explain()
    assert "moves" in e and "values" in e


def test_bad_model_is_an_exception(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    try:
        mf.Model.load(bad)
    except mf.Error as e:
        assert "bad.json" in str(e)
    else:
        raise AssertionError("no error")
