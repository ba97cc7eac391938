"""Model files from Python: run, train with check, explain."""

import json
import os
import pathlib
import tempfile

import numpy as np
import pytest

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


def test_explain_estimates_the_step_train_would_run():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    sgd, adamw = m.explain(), m.explain(optimizer="adamw")
    assert sgd["est_step_s"] > 0 and adamw["est_step_s"] > sgd["est_step_s"]
    assert sgd["memory"]["optimizer_state"] == 0 < adamw["memory"]["optimizer_state"]
    assert "w1.exp_avg" in adamw["values"] and "w1.exp_avg" not in sgd["values"]
    micro = m.explain(micro_batches=4)
    assert micro["memory"]["activations"] < sgd["memory"]["activations"]
    try:
        m.explain(micro_batches=0)
    except mf.Error as e:
        assert "micro_batches= 0" in str(e)
    else:
        raise AssertionError("no error")


def test_explain_and_autoshard_take_machine(tmp_path, monkeypatch):
    # None: this machine's description, measured once into the cache folder and read after;
    # "default": the built-in one; a file: that description. Both calls take the same machine=.
    cache = tmp_path / "cache"  # under mpirun rank 0's alone is read and written
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    m = mf.Model.load(MODELS / "dp_mlp.json")
    built_in = m.explain(machine="default")
    measured = m.explain()
    assert m.explain()["est_step_s"] == measured["est_step_s"]
    assert measured["est_step_s"] != built_in["est_step_s"]
    if mf.rank() == 0:
        (file,) = list((cache / "meshflow").iterdir())
        assert json.loads(file.read_text())["machine"]["gemm_gflops"] > 0
    # A machine whose kernels are a hundred thousand times slower than any real one's.
    link = {"bandwidth_gbps": 5.0, "latency_us": 2.0}
    (tmp_path / "slow.json").write_text(json.dumps({
        "links": {"shared_memory": link, "mpi": link}, "default_link": "shared_memory",
        "memcpy_gbps": 10.0, "collective_overhead_us": 20.0, "gemm_gflops": 0.001,
        "elementwise_gbps": 0.001}))
    slow = m.explain(machine=tmp_path / "slow.json")
    assert slow["est_step_s"] > measured["est_step_s"]
    for machine, est in [("default", built_in), (tmp_path / "slow.json", slow)]:
        r = mf.autoshard(MODELS / "dp_mlp.json", machine=machine)
        assert r["given_est_step_s"] == pytest.approx(est["est_step_s"], rel=1e-9)


def test_bad_model_is_an_exception(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    try:
        mf.Model.load(bad)
    except mf.Error as e:
        assert "bad.json" in str(e)
    else:
        raise AssertionError("no error")


def test_train_takes_the_optimizer_options():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    r = m.train(3, optimizer="adamw", lr=0.01, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05,
                clip_grad_norm=0.5, warmup_steps=1, decay="cosine", decay_steps=3, check=True)
    assert r["check"]["max_loss_diff"] < 1e-5 and r["check"]["max_weight_diff"] < 1e-4
    assert r["steps"][2]["loss"] < r["steps"][0]["loss"]
    sgd = m.train(2, momentum=0.9, check=True)  # lr=None: sgd's 0.1
    assert sgd["check"]["max_weight_diff"] < 1e-5


def test_bad_optimizer_option_names_the_keyword():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    for kwargs, want in [(dict(lr=float("nan")), "lr= nan: must be finite and >= 0"),
                         (dict(optimizer="adamw", momentum=0.9),
                          "momentum= is not an option of --optimizer adamw"),
                         (dict(optimizer="adam"), 'optimizer="adam": must be'),
                         (dict(decay="cosine"), "decay= cosine needs decay_steps=")]:
        try:
            m.train(1, **kwargs)
        except mf.Error as e:
            assert want in str(e), str(e)
        else:
            raise AssertionError(f"no error for {kwargs}")


def test_a_nonfinite_loss_raises_naming_the_step():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    try:
        m.train(3, lr=1e30)
    except mf.Error as e:
        assert "step 2: the loss is not finite" in str(e)
    else:
        raise AssertionError("a nan loss trained on")
    r = m.train(3, lr=1e30, allow_nonfinite=True)
    assert r["steps"][1]["loss"] is None


def _mlp_files(tmp_path, rng):
    """Writes a DP x TP MLP on a 2x2 mesh (weights from .npy files) and returns its arrays."""
    import json
    arrays = {"x": rng.standard_normal((16, 6)).astype(np.float32),
              "y": rng.integers(0, 4, 16).astype(np.int64),
              "w1": (0.4 * rng.standard_normal((6, 8))).astype(np.float32),
              "b1": (0.1 * rng.standard_normal(8)).astype(np.float32),
              "w2": (0.4 * rng.standard_normal((8, 4))).astype(np.float32),
              "b2": (0.1 * rng.standard_normal(4)).astype(np.float32)}
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a)
    placements = {"x": ["S(0)", "R"], "y": ["S(0)", "R"], "w1": ["R", "S(1)"], "b1": ["R", "S(0)"],
                  "w2": ["R", "S(0)"], "b2": ["R", "R"]}
    tensors = {}
    for name, a in arrays.items():
        kind = "input" if name in ("x", "y") else "weight"
        tensors[name] = {"shape": list(a.shape), "dtype": str(a.dtype), kind: f"{name}.npy",
                         "mesh": "m", "placements": placements[name]}
    model = {"meshes": {"m": "2x2"}, "tensors": tensors,
             "nodes": [{"name": "h", "op": "linear", "inputs": ["x", "w1", "b1"]},
                       {"name": "a", "op": "relu", "inputs": ["h"]},
                       {"name": "o", "op": "linear", "inputs": ["a", "w2", "b2"]},
                       {"name": "r", "op": "reduction", "inputs": ["o"], "degree": 2,
                        "placements": ["S(0)", "R"]},
                       {"name": "loss", "op": "softmax_cross_entropy", "inputs": ["r", "y"]}],
             "loss": "loss"}
    (tmp_path / "mlp.json").write_text(json.dumps(model))
    return arrays


def _schedule(lr, warmup, decay, decay_steps):
    """DESIGN's learning rate of step t (1-based), written out again for torch's LambdaLR."""
    import math

    def at(t):
        if warmup and t <= warmup:
            return lr * t / warmup
        if decay == "none":
            return lr
        u = (t - warmup) / decay_steps
        if u >= 1:
            return 0.0
        return lr * 0.5 * (1 + math.cos(math.pi * u)) if decay == "cosine" else lr * (1 - u)
    return at


def test_training_equals_torch_optim(tmp_path, rng):
    """AdamW and SGD with momentum, clip_grad_norm_ and a schedule, step by step against
    torch.optim on the same model and data (skipped where python3-torch does not import)."""
    torch = __import__("pytest").importorskip("torch")
    torch.set_num_threads(1)
    arrays = _mlp_files(tmp_path, rng)
    steps = 6
    configs = [
        dict(optimizer="adamw", lr=0.02, betas=(0.85, 0.98), eps=1e-7, weight_decay=0.05,
             clip_grad_norm=0.3, warmup_steps=2, decay="cosine", decay_steps=3),
        dict(optimizer="sgd", lr=0.2, momentum=0.9, clip_grad_norm=0.3, warmup_steps=1,
             decay="linear", decay_steps=4),
    ]
    m = mf.Model.load(tmp_path / "mlp.json")
    for config in configs:
        ours = [s["loss"] for s in m.train(steps, **config)["steps"]]
        p = {k: torch.nn.Parameter(torch.from_numpy(arrays[k].copy()))
             for k in ("w1", "b1", "w2", "b2")}
        params = list(p.values())
        if config["optimizer"] == "adamw":
            opt = torch.optim.AdamW(params, lr=config["lr"], betas=config["betas"],
                                    eps=config["eps"], weight_decay=config["weight_decay"])
        else:
            opt = torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"])
        at = _schedule(config["lr"], config["warmup_steps"], config["decay"], config["decay_steps"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: at(e + 1) / config["lr"])
        x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
        theirs = []
        for _ in range(steps):
            opt.zero_grad()
            h = torch.relu(x @ p["w1"] + p["b1"])
            loss = torch.nn.functional.cross_entropy(h @ p["w2"] + p["b2"], y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config["clip_grad_norm"])
            opt.step()
            sched.step()
            theirs.append(loss.item())
        assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (config["optimizer"], ours, theirs)
        assert theirs[-1] < theirs[0]


def test_micro_batches_equal_the_full_batch():
    m = mf.Model.load(MODELS / "dp_tp_mlp.json")
    full = [s["loss"] for s in m.train(3, optimizer="adamw", lr=0.01)["steps"]]
    r = m.train(3, optimizer="adamw", lr=0.01, micro_batches=4, check=True)
    assert np.allclose([s["loss"] for s in r["steps"]], full, rtol=1e-6, atol=1e-6)
    assert r["check"]["max_grad_diff"] < 1e-5
    try:
        m.train(1, micro_batches=3)
    except mf.Error as e:
        assert "does not split into 3 micro-batches" in str(e)
    else:
        raise AssertionError("64 rows split into 3")


def test_zero_levels_train_alike_and_shard_the_state():
    m = mf.Model.load(MODELS / "dp_mlp.json")
    base = [s["loss"] for s in m.train(3, optimizer="adamw", lr=0.01)["steps"]]
    for zero in (1, 3):
        r = m.train(3, optimizer="adamw", lr=0.01, zero=zero, micro_batches=2, check=True)
        assert np.allclose([s["loss"] for s in r["steps"]], base, rtol=1e-6, atol=1e-6), zero
        assert r["check"]["max_weight_diff"] < 1e-5
        assert r["measured_peak_bytes"] > 0
    e0, e1, e3 = (m.explain(optimizer="adamw", zero=z) for z in (0, 1, 3))
    # A quarter, up to the chunk rule on the 10-element bias (device 0 holds 3).
    assert e0["memory"]["optimizer_state"] / 4 <= e1["memory"]["optimizer_state"] < e0["memory"]["optimizer_state"] / 3.9
    # The ZeRO layout shards the outermost dim the mesh divides: w1's rows.
    assert e1["values"]["w1.exp_avg"]["placements"] == ["S(0)"]
    assert e3["values"]["w1"]["placements"] == ["S(0)"]
    gathers = [mv for mv in e3["moves"] if "freed_after" in mv]
    assert {mv["value"] for mv in gathers} == {"w1", "b1", "w2", "b2"}
    try:
        m.train(1, zero=2)
    except mf.Error as e:
        assert "zero= 2: must be 0, 1 or 3" in str(e)
    else:
        raise AssertionError("no error")


def test_checkpoint_and_resume_onto_another_layout(tmp_path):
    # Under mpirun every rank must name the same folder: one per job (Open MPI's PMIx namespace).
    job = os.environ.get("PMIX_NAMESPACE")
    if job:
        tmp_path = pathlib.Path(tempfile.gettempdir()) / f"meshflow_ckpt_test_{job}"
    dp = mf.Model.load(MODELS / "gpt" / "gpt_dp.json")
    whole = [s["loss"] for s in dp.train(4, optimizer="adamw", lr=3e-3)["steps"]]
    dp.train(2, optimizer="adamw", lr=3e-3, checkpoint=tmp_path / "ck", checkpoint_every=1,
             keep_last=1)
    listed = mf.checkpoint.list(tmp_path / "ck", verify=True)["checkpoints"]
    assert [c["step"] for c in listed] == [2] and listed[0]["verified"] is True
    assert listed[0]["tensors"]["b0_w1.exp_avg"]["shape"] == [16, 64]
    r = mf.Model.load(MODELS / "gpt" / "gpt_dp_tp.json").train(
        2, resume=tmp_path / "ck", check=True)
    assert [s["step"] for s in r["steps"]] == [3, 4]
    assert np.allclose([s["loss"] for s in r["steps"]], whole[2:], rtol=1e-6, atol=1e-6)
    assert r["check"]["max_weight_diff"] < 1e-5
    try:
        dp.train(1, resume=tmp_path / "ck", optimizer="sgd")
    except mf.Error as e:
        assert "optimizer= sgd" in str(e)
    else:
        raise AssertionError("no error")


def test_threads_per_device():
    m = mf.Model.load(MODELS / "gpt" / "gpt_one.json")
    one = [s["loss"] for s in m.train(2, threads_per_device=1)["steps"]]
    three = [s["loss"] for s in m.train(2, threads_per_device=3)["steps"]]
    assert np.allclose(three, one, rtol=1e-5, atol=1e-6)
    out = m.run(threads_per_device=2)
    assert np.isfinite(out["loss"])
    # explain prices the step with the threads asked for: fewer threads, a longer step (more
    # threads than cores gain nothing), on one description (each thread count's measured one is
    # its own measurement).
    one, two = (m.explain(threads_per_device=t, machine="default")["est_step_s"] for t in (1, 2))
    assert two < one if (os.cpu_count() or 1) >= 2 else two == one
    try:
        m.train(1, threads_per_device=0)
    except mf.Error as e:
        assert "threads_per_device= 0" in str(e)
    else:
        raise AssertionError("threads_per_device=0 accepted")


def test_a_transpose_feeding_a_product_is_folded(tmp_path):
    # Weight tying: the token table is the embedding and, transposed, the LM head. The transpose
    # is read through BLAS's flag (no node for it), and training equals the graph as written.
    rng = np.random.default_rng(5)
    np.save(tmp_path / "ids.npy", rng.integers(0, 16, size=(8, 4)).astype(np.int64))
    np.save(tmp_path / "next.npy", rng.integers(0, 16, size=32).astype(np.int64))
    model = {
        "meshes": {"m": "2"},
        "tensors": {
            "ids": {"shape": [8, 4], "dtype": "int64", "input": "ids.npy", "mesh": "m",
                    "placements": ["S(0)"]},
            "next": {"shape": [32], "dtype": "int64", "input": "next.npy", "mesh": "m",
                     "placements": ["S(0)"]},
            "tok": {"shape": [16, 6], "weight": {"normal": 0.5, "seed": 1}, "mesh": "m",
                    "placements": ["R"]},
        },
        "nodes": [
            {"name": "e", "op": "embedding", "inputs": ["ids", "tok"]},
            {"name": "flat", "op": "reshape", "inputs": ["e"], "shape": [-1, 6]},
            {"name": "head", "op": "transpose", "inputs": ["tok"]},
            {"name": "logits", "op": "matmul", "inputs": ["flat", "head"]},
            {"name": "loss", "op": "softmax_cross_entropy", "inputs": ["logits", "next"]},
        ],
        "loss": "loss",
        "outputs": ["loss"],
    }
    path = tmp_path / "tied.json"
    path.write_text(__import__("json").dumps(model))
    m = mf.Model.load(path)
    assert "head" not in m.explain()["values"]
    r = m.train(3, lr=0.5, check=True)
    assert r["check"]["max_loss_diff"] < 1e-5 and r["check"]["max_grad_diff"] < 1e-5
    assert r["check"]["max_weight_diff"] < 1e-5
    assert r["steps"][-1]["loss"] < r["steps"][0]["loss"]


def test_pipeline_schedules_train_as_one_device_and_explain_their_order():
    m = mf.Model.load(MODELS / "pipeline4_mlp.json")
    for schedule in ["gpipe", "1f1b", "zb"]:
        r = m.train(2, micro_batches=4, schedule=schedule, check=True)
        assert r["check"]["max_loss_diff"] < 1e-5 and r["check"]["max_weight_diff"] < 1e-5
        assert all(0 <= s["bubble"] < 1 for s in r["steps"])
    e = m.explain(micro_batches=4, schedule="1f1b")
    assert [s["tasks"] for s in e["schedule"]][0] == ["F0", "F1", "F2", "F3", "B0", "B1", "B2",
                                                       "B3"]
    assert e["schedule"][3]["tasks"][:2] == ["F0", "B0"] and 0 < e["est_bubble"] < 1
    assert mf.Model.load(MODELS / "dp_mlp.json").explain()["schedule"] is None
    try:
        m.train(1, schedule="interleaved")
    except mf.Error as err:
        assert "interleaved" in str(err)
    else:
        raise AssertionError("no error")


def test_recompute_trains_as_none_and_the_train_object_sets_it_and_the_schedule(tmp_path):
    m = mf.Model.load(MODELS / "gpt" / "gpt_dp.json")
    none = m.train(2, optimizer="adamw", recompute="none")
    for policy in ["selective", "full"]:
        r = m.train(2, optimizer="adamw", recompute=policy)
        assert [s["loss"] for s in r["steps"]] == [s["loss"] for s in none["steps"]], policy
        e = m.explain(recompute=policy)
        assert e["recompute"] and all(s["nodes"] for s in e["recompute"]), policy
    assert m.explain()["recompute"] == []
    # The model file's "train" object: its schedule and recompute are used, and lose to the
    # keywords.
    model = __import__("json").loads((MODELS / "pipeline4_mlp.json").read_text())
    model["train"] = {"micro_batches": 4, "schedule": "gpipe", "recompute": "full"}
    model["tensors"]["x"]["input"] = str(MODELS / "x.npy")
    model["tensors"]["y"]["input"] = str(MODELS / "y.npy")
    path = tmp_path / "p.json"
    path.write_text(__import__("json").dumps(model))
    p = mf.Model.load(path)
    e = p.explain()
    assert e["schedule"][0]["tasks"] == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert e["recompute"]
    e = p.explain(schedule="1f1b", recompute="none")
    assert e["schedule"][0]["tasks"][:5] == ["F0", "F1", "F2", "F3", "B0"]
    assert e["schedule"][3]["tasks"][:2] == ["F0", "B0"] and e["recompute"] == []
    with pytest.raises(mf.Error, match="everything"):
        p.train(1, recompute="everything")


def test_autoshard_returns_the_cli_dict_and_writes_a_file_that_trains(tmp_path):
    out = tmp_path / "auto.json"
    r = mf.autoshard(MODELS / "dp_mlp.json", mesh="2x2", out=out)
    assert set(r) >= {"est_step_s", "given_est_step_s", "memory_per_device_bytes", "zero",
                      "micro_batches", "search_s", "values"}
    assert r["given_est_step_s"] is None  # the model's 1-d placements do not fit 2x2
    assert r["values"]["x"]["mesh"] == "2x2@0,1,2,3"
    m = mf.Model.load(out)
    assert abs(m.explain()["est_step_s"] - r["est_step_s"]) <= 1e-9 * r["est_step_s"]
    t = m.train(2, check=True)
    assert t["check"]["max_loss_diff"] < 1e-5 and t["check"]["max_weight_diff"] < 1e-5
    with pytest.raises(mf.InvalidArgumentError, match="the least any choice needs is"):
        mf.autoshard(MODELS / "dp_mlp.json", memory_limit=1000)
