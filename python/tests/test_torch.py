"""The PyTorch front end (docs/torch.md): every mapped call against PyTorch's forward and
backward, the example GPT and an MLP trained 5 AdamW steps equal to torch.optim.AdamW on every
layout, tied weights, the round trip back to the module, and one-line errors. Under mpirun -n 4
(python_mpi) the same tests run with each process one device."""

import math
import os
import pathlib
import sys
import tempfile

import numpy as np
import pytest

import meshflow as mf

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch"))
import gpt as example_gpt  # noqa: E402


def shared_dir(tmp_path, name):
    """A folder every rank names alike (checkpoints are written by all devices into one)."""
    job = os.environ.get("PMIX_NAMESPACE")
    if job:
        d = pathlib.Path(tempfile.gettempdir()) / f"meshflow_torch_test_{job}_{name}"
        d.mkdir(exist_ok=True)
        return d
    return tmp_path / name


def weights_after(model, tmp_path, name, **train):
    """Trains `model` and returns (the train dict, its weights under torch names)."""
    ck = shared_dir(tmp_path, name)
    result = model.train(checkpoint=ck, **train)
    return result, mf.to_torch_state_dict(ck, model=model.path)


# -- every mapped call, one by one ----------------------------------------------------------

class OneCall(nn.Module):
    """x -> f(linear(x)) against a target with mse: f's forward is in the loss, its backward
    in the linear's gradient."""

    def __init__(self, f, din=8, dout=8, extra=None):
        super().__init__()
        self.lin = nn.Linear(din, dout)
        self.f = f
        if extra is not None:
            self.extra = extra

    def forward(self, x, y):
        return F.mse_loss(self.f(self, self.lin(x)), y)


def attention(causal, scale=None):
    def f(self, h):  # [4, 8 * 4] as [batch 4, heads 2, positions 4, dh 4]
        q = h.view(4, 4, 2, 4).transpose(1, 2)
        k = (h * 0.5).view(4, 4, 2, 4).transpose(1, 2)
        v = torch.tanh(h).view(4, 4, 2, 4).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (scale or 1.0 / math.sqrt(k.size(-1)))
        if causal:
            mask = torch.tril(torch.ones(4, 4)).view(1, 1, 4, 4)
            att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(4, 32)
    return f


CALLS = {
    "relu": (lambda s, h: F.relu(h), 8),
    "gelu": (lambda s, h: F.gelu(h), 8),
    "gelu_tanh": (lambda s, h: F.gelu(h, approximate="tanh"), 8),
    "tanh": (lambda s, h: torch.tanh(h), 8),
    "sigmoid": (lambda s, h: torch.sigmoid(h), 8),
    "exp": (lambda s, h: torch.exp(h * 0.1), 8),
    "neg_sub": (lambda s, h: -h - torch.tanh(h), 8),
    "mul_div": (lambda s, h: h * torch.sigmoid(h) / 3.0, 8),
    "add": (lambda s, h: h + torch.tanh(h) + 1.5, 8),
    "softmax": (lambda s, h: F.softmax(h, dim=-1), 8),
    "view_transpose": (lambda s, h: h.view(4, 2, 4).transpose(1, 2).reshape(4, 8), 8),
    "permute_flatten": (lambda s, h: h.view(4, 2, 4).permute(0, 2, 1).contiguous()
                        .flatten(1), 8),
    "split_chunk": (lambda s, h: h.split(4, dim=1)[1] * h.chunk(2, dim=1)[0], 4),
    "slice": (lambda s, h: h[:, 2:6], 4),
    "matmul": (lambda s, h: h @ s.extra, 6),
    "layer_norm": (lambda s, h: s.extra(h), 8),
    "dropout_p0": (lambda s, h: F.dropout(h, p=0.0, training=True), 8),
    "attention": (attention(False), 32),
    "attention_causal": (attention(True), 32),
    "mean_sum": (lambda s, h: h.mean(dim=1) + h.sum(dim=-1), None),
}


def extra_of(name):
    if name == "matmul":
        return nn.Parameter(torch.randn(8, 6))
    if name == "layer_norm":
        ln = nn.LayerNorm(8)
        with torch.no_grad():
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.normal_()
        return ln
    return None


def check_one_sgd_step(m, inputs, tmp_path):
    """PyTorch's loss and gradients against meshflow's first loss and its SGD step at lr 1
    (the weights move by minus the gradient)."""
    loss = m(*inputs)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    before = {k: v.clone() for k, v in m.state_dict().items()}
    model = mf.from_torch(m, inputs, out=tmp_path / "m.json")
    result, after = weights_after(model, tmp_path, "ck", steps=1, optimizer="sgd", lr=1.0)
    assert abs(result["steps"][0]["loss"] - loss.item()) <= 1e-5 * max(1, abs(loss.item()))
    for k, g in grads.items():
        np.testing.assert_allclose((before[k] - after[k]).numpy(), g.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_mapped_call_equals_pytorch_forward_and_backward(name, tmp_path):
    torch.manual_seed(len(name))
    f, width = CALLS[name]
    dout = 32 if name.startswith("attention") else 8
    m = OneCall(f, dout=dout, extra=extra_of(name))
    x = torch.randn(4, 8)
    y = torch.randn(4, width) if width is not None else torch.randn(4)
    check_one_sgd_step(m, (x, y), tmp_path)


def test_embedding_layer_norm_and_cross_entropy(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.ln = nn.LayerNorm(8)
            self.out = nn.Linear(8, 10)

        def forward(self, ids, labels):
            return F.cross_entropy(self.out(self.ln(self.emb(ids))), labels)

    torch.manual_seed(3)
    m = Net()
    ids, labels = torch.randint(0, 10, (6,)), torch.randint(0, 10, (6,))
    check_one_sgd_step(m, (ids, labels), tmp_path)


# -- tied weights and the round trip ----------------------------------------------------------

def small_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    config = example_gpt.GPTConfig(**{"block_size": 8, "vocab_size": 32, "n_layer": 2,
                                      "n_head": 4, "n_embd": 16, **kw})
    return example_gpt.GPT(config)


def test_tied_weights_are_one_weight_whose_gradient_sums_both_uses(tmp_path):
    m = small_gpt()
    idx, targets = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
    _, loss = m(idx, targets)
    loss.backward()
    tied = m.lm_head.weight.grad.clone()
    before = m.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    model = mf.from_torch(m, (idx, targets), out=tmp_path / "gpt.json")
    import json
    tensors = json.loads((tmp_path / "gpt.json").read_text())["tensors"]
    assert "transformer.wte.weight" in tensors and "lm_head.weight" not in tensors
    _, after = weights_after(model, tmp_path, "ck", steps=1, optimizer="sgd", lr=1.0)
    assert torch.equal(after["lm_head.weight"], after["transformer.wte.weight"])
    np.testing.assert_allclose((before["lm_head.weight"] - after["lm_head.weight"]).numpy(),
                               tied.numpy(), rtol=1e-4, atol=1e-6)
    fresh = small_gpt(seed=1)
    fresh.load_state_dict(after, strict=True)  # every name, buffers included
    assert fresh.lm_head.weight.data_ptr() == fresh.transformer.wte.weight.data_ptr() or \
        torch.equal(fresh.lm_head.weight, fresh.transformer.wte.weight)


def test_the_round_trip_of_a_converted_model_is_the_module(tmp_path):
    m = small_gpt()
    idx, targets = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
    plan = {"transformer.h.*.attn.c_attn": "colwise", "transformer.h.*.attn.c_proj": "rowwise",
            "*": "replicate"}
    mf.from_torch(m, (idx, targets), mesh="4", plan=plan, out=tmp_path / "gpt.json")
    back = mf.to_torch_state_dict(tmp_path / "gpt.json")
    assert list(back) == list(m.state_dict())
    for k, v in m.state_dict().items():
        assert torch.equal(back[k], v), k  # the q/k/v permutation undone exactly


# -- 5 steps of AdamW on every layout ---------------------------------------------------------

GPT_PLAN = {"transformer.h.*.attn.c_attn": "colwise", "transformer.h.*.attn.c_proj": "rowwise",
            "transformer.h.*.mlp.c_fc": "colwise", "transformer.h.*.mlp.c_proj": "rowwise",
            "transformer.wte": "vocab", "lm_head": "colwise", "*": "replicate"}
# Sequence parallelism as torch's SequenceParallel: the norms (and the residual stream) split on
# the sequence.
SP_PLAN = {**{k: v for k, v in GPT_PLAN.items() if k != "*"},
           "transformer.h.*.ln_?": "sequence", "transformer.ln_f": "sequence", "*": "replicate"}
LAYOUTS = {"one": ("1", None), "dp4": ("4", None), "tp4": ("4", GPT_PLAN), "dp_tp": ("2x2", GPT_PLAN),
           "auto": ("4", "auto")}


def torch_adamw(module, batches, steps):
    opt = torch.optim.AdamW(module.parameters())
    losses = []
    for b in batches[:steps]:
        opt.zero_grad()
        loss = b()
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


@pytest.fixture(scope="module")
def token_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(62)
    np.save(d / "train.npy", rng.integers(0, 32, size=4000).astype(np.uint16))
    return d


@pytest.mark.parametrize("layout", sorted(LAYOUTS) + ["sp4"])
def test_gpt_trains_equal_to_pytorch_adamw(layout, token_data, tmp_path):
    mesh, plan = LAYOUTS[layout] if layout != "sp4" else ("4", SP_PLAN)
    m = small_gpt()
    ref = small_gpt()
    idx = torch.zeros(8, 8, dtype=torch.long)
    data = {"idx": {"data": "window"}, "targets": {"data": "window", "shift": 1},
            "data": {"train": str(token_data / "train.npy"), "order": "shuffled", "seed": 3}}
    model = mf.from_torch(m, (idx, idx), mesh=mesh, plan=plan, data=data,
                          out=tmp_path / "gpt.json")
    batches = mf.data.batches(model, steps=(1, 5))
    ours, after = weights_after(model, tmp_path, "ck", steps=5, optimizer="adamw")
    theirs = torch_adamw(ref, [lambda b=b: ref(torch.from_numpy(b["idx"]),
                                                torch.from_numpy(b["targets"]))[1]
                               for b in batches], 5)
    for a, b in zip([s["loss"] for s in ours["steps"]], theirs):
        assert abs(a - b) <= 1e-4 * abs(b), (layout, a, b)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(after[k].numpy(), v.numpy(), rtol=0, atol=1e-4, err_msg=k)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                                 nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


MLP_PLAN = {"net.0": "colwise", "net.2": "rowwise", "*": "replicate"}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_mlp_trains_equal_to_pytorch_adamw(layout, tmp_path):
    mesh, plan = LAYOUTS[layout]
    plan = MLP_PLAN if isinstance(plan, dict) else plan
    torch.manual_seed(5)
    m = MLP()
    ref = MLP()
    ref.load_state_dict(m.state_dict())
    x, y = torch.randn(16, 16), torch.randint(0, 10, (16,))

    def loss(out, x, y):
        return F.cross_entropy(out, y)

    model = mf.from_torch(m, (x, y), loss=loss, mesh=mesh, plan=plan, out=tmp_path / "mlp.json")
    ours, after = weights_after(model, tmp_path, "ck", steps=5, optimizer="adamw")
    theirs = torch_adamw(ref, [lambda: F.cross_entropy(ref(x), y)] * 5, 5)
    for a, b in zip([s["loss"] for s in ours["steps"]], theirs):
        assert abs(a - b) <= 1e-4 * abs(b), (layout, a, b)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(after[k].numpy(), v.numpy(), rtol=0, atol=1e-4, err_msg=k)


# -- errors -----------------------------------------------------------------------------------

def test_an_unsupported_call_names_the_module_and_the_call(tmp_path):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x, y):
            return F.mse_loss(torch.cumsum(self.inner(x), dim=1), y)

    m = Odd()
    with pytest.raises(mf.InvalidArgumentError, match=r"^\(the module itself\): aten::cumsum"):
        mf.from_torch(m, (torch.randn(2, 4), torch.randn(2, 4)), out=tmp_path / "m.json")


def test_a_plan_naming_no_module_or_not_fitting_is_one_line(tmp_path):
    m = small_gpt()
    idx = torch.randint(0, 32, (4, 8))
    with pytest.raises(mf.InvalidArgumentError, match=r"plan 'transformer\.h\.\*\.attn\.qkv': "
                                                      r"names no module"):
        mf.from_torch(m, (idx, idx), mesh="4", plan={"transformer.h.*.attn.qkv": "colwise"},
                      out=tmp_path / "m.json")
    with pytest.raises(mf.InvalidArgumentError,
                       match=r"lm_head is colwise, which splits its out_features 32 over 3"):
        mf.from_torch(m, (torch.randint(0, 32, (3, 8)),) * 2, mesh="3",
                      plan={"lm_head": "colwise"}, out=tmp_path / "m.json")
    with pytest.raises(mf.InvalidArgumentError, match=r"sequence does not apply to lm_head"):
        mf.from_torch(m, (idx, idx), mesh="4", plan={"lm_head": "sequence"},
                      out=tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.skipif(mf.backend() == "mpi", reason="under mpi a failed step ends the whole job "
                    "(docs/failures.md), so the threads run checks the message")
def test_a_label_equal_to_ignore_index_stops_training_naming_the_step(tmp_path):
    m = small_gpt()
    idx = torch.randint(0, 32, (4, 8))
    targets = idx.clone()
    targets[1, 3] = -1
    model = mf.from_torch(m, (idx, targets), out=tmp_path / "gpt.json")
    with pytest.raises(mf.Error, match=r"step 1"):
        model.train(1)
