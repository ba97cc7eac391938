"""Every operator of meshflow.ops on DTensors against NumPy, on sharded operands."""

import math

import numpy as np
import pytest

import meshflow as mf
from conftest import placements_of

erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_grad(x):
    return 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def dist(mesh, a, *spec):
    return mf.distribute_tensor(a, mesh, placements_of(mesh, spec))


def close(t, want):
    got = t.full_tensor()
    assert got.shape == np.shape(want)
    assert np.allclose(got, want, rtol=1e-10, atol=1e-10), (got, want)


def test_arithmetic_operators(mesh, rng):
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((6, 5)) + 3
    row = rng.standard_normal((5,))
    x, y = dist(mesh, a, "S0", "R"), dist(mesh, b, "S0", "S1")
    r = dist(mesh, row, "R")
    close(x + y, a + b)
    close(x - y, a - b)
    close(x * y, a * b)
    close(x / y, a / b)
    close(-x, -a)
    close(x + r, a + row)  # NumPy broadcasting
    close(x + 2, a + 2)
    close(2.5 - x, 2.5 - a)
    close(x * 3, a * 3)
    close(1 / y, 1 / b)
    w = rng.standard_normal((5, 4))
    close(x @ dist(mesh, w, "R", "S1"), a @ w)


@pytest.mark.parametrize("name, fn", [
    ("relu", lambda a: np.maximum(a, 0)), ("gelu", gelu), ("tanh", np.tanh),
    ("sigmoid", lambda a: 1 / (1 + np.exp(-a))), ("exp", np.exp), ("neg", np.negative),
])
def test_unary(mesh, rng, name, fn):
    a = rng.standard_normal((7, 3))
    close(getattr(mf.ops, name)(dist(mesh, a, "S0", "S1")), fn(a))


def test_reductions_and_softmax(mesh, rng):
    a = rng.standard_normal((6, 4, 5))
    x = dist(mesh, a, "S1", "S0")
    close(mf.ops.sum(x, dims=[0, 2]), a.sum((0, 2)))
    close(mf.ops.mean(x, dims=[1]), a.mean(1))
    close(mf.ops.softmax(x, dim=1), softmax(a, 1))
    close(mf.ops.softmax(x), softmax(a, -1))


def test_matmul_linear_and_losses(mesh, rng):
    a, w, bias = rng.standard_normal((8, 6)), rng.standard_normal((6, 4)), rng.standard_normal(4)
    x = dist(mesh, a, "S0", "R")
    W, B = dist(mesh, w, "R", "S1"), dist(mesh, bias, "S0")
    close(mf.ops.matmul(x, W), a @ w)
    close(mf.ops.linear(x, W), a @ w)
    close(mf.ops.linear(x, W, B), a @ w + bias)
    labels = rng.integers(0, 4, size=8).astype(np.int64)
    logits = a @ w
    p = softmax(logits)
    ce = -np.mean(np.log(p[np.arange(8), labels]))
    close(mf.ops.softmax_cross_entropy(dist(mesh, logits, "S0"), dist(mesh, labels, "S0")), ce)
    t = rng.standard_normal((8, 4))
    close(mf.ops.mse(dist(mesh, logits, "S0"), dist(mesh, t, "R", "S1")), np.mean((logits - t) ** 2))


def test_vocabulary_parallel_cross_entropy(mesh, rng):
    # Logits split over the classes (2051: uneven) on the last mesh dim, rows over the first of
    # a 2-d mesh: the loss and its gradient run vocabulary-parallel and equal NumPy's.
    rows, classes = 512, 2051
    logits = rng.standard_normal((rows, classes))
    labels = rng.integers(0, classes, size=rows).astype(np.int64)
    spec = ("S1",) if mesh.ndim == 1 else ("S0", "S1")
    X, Y = dist(mesh, logits, *spec), dist(mesh, labels, *spec[:-1])
    p = softmax(logits)
    close(mf.ops.softmax_cross_entropy(X, Y), -np.mean(np.log(p[np.arange(rows), labels])))
    grad = mf.ops.softmax_cross_entropy_grad(X, Y, dist(mesh, np.array(0.5)))
    assert mf.placement.to_text(grad.placements) == mf.placement.to_text(X.placements)
    close(grad, 0.5 * (p - np.eye(classes)[labels]) / rows)


def test_gradient_operators(mesh, rng):
    g, b = rng.standard_normal((8, 4)), rng.standard_normal((6, 4))
    a = rng.standard_normal((8, 6))
    G, Bm, A = dist(mesh, g, "S0"), dist(mesh, b, "R", "S0"), dist(mesh, a, "S0", "S1")
    close(mf.ops.matmul_grad_a(G, Bm), g @ b.T)
    close(mf.ops.matmul_grad_b(A, G), a.T @ g)
    x = rng.standard_normal((8, 4))
    X = dist(mesh, x, "S1")
    close(mf.ops.relu_grad(G, X), g * (x > 0))
    close(mf.ops.gelu_grad(G, X), g * gelu_grad(x))
    y = np.tanh(x)
    close(mf.ops.tanh_grad(G, dist(mesh, y, "S0")), g * (1 - y * y))
    s = 1 / (1 + np.exp(-x))
    close(mf.ops.sigmoid_grad(G, dist(mesh, s, "S0")), g * s * (1 - s))
    sm = softmax(x)
    close(mf.ops.softmax_grad(G, dist(mesh, sm, "S0"), dim=-1),
          sm * (g - (g * sm).sum(-1, keepdims=True)))
    labels = rng.integers(0, 4, size=8).astype(np.int64)
    onehot = np.eye(4)[labels]
    g0 = np.array(1.7)
    close(mf.ops.softmax_cross_entropy_grad(X, dist(mesh, labels, "S0"), dist(mesh, g0)),
          1.7 * (sm - onehot) / 8)
    t = rng.standard_normal((8, 4))
    close(mf.ops.mse_grad(X, dist(mesh, t, "R"), dist(mesh, g0)), 1.7 * 2 * (x - t) / x.size)
    close(mf.ops.sum_to(X, shape=[4]), x.sum(0))
    v = rng.standard_normal(4)
    close(mf.ops.broadcast_to(dist(mesh, v, "S0"), dims=[0], shape=[3, 4], scale=0.5),
          np.broadcast_to(v, (3, 4)) * 0.5)


@pytest.mark.parametrize("shape,spec,target", [
    ((12, 8), ("S1",), (16, 6)),             # DTensor's wrong answer (pytorch#179502)
    ((12, 8), ("S0", "S1"), (16, 6)),
    ((10, 6), ("S0",), (60,)),                # uneven shards
    ((3, 4), ("S0", "S1"), (2, 6)),           # empty shards on 4 devices
    ((4, 6, 16), ("S0", "S2"), (4, 6, 4, 4)),  # split a sharded dim
    ((4, 6, 8), ("S0", "S1"), (24, 8)),       # merge two sharded dims
    ((4, 6, 8), ("S2", "S1"), (-1,)),
])
def test_reshape_matches_numpy_on_every_layout(mesh, rng, shape, spec, target):
    a = rng.standard_normal(shape)
    close(mf.ops.reshape(dist(mesh, a, *spec), shape=list(target)), a.reshape(target))


def test_transpose_layer_norm_embedding_attention(mesh, rng):
    a = rng.standard_normal((4, 6, 5))
    close(mf.ops.transpose(dist(mesh, a, "S0", "S1"), dims=[2, 0, 1]), a.transpose(2, 0, 1))
    close(mf.ops.transpose(dist(mesh, a, "S1")), a.transpose())
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    mean, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    close(mf.ops.layer_norm(dist(mesh, a, "S0", "S1"), dist(mesh, w), dist(mesh, b), eps=1e-3),
          (a - mean) / np.sqrt(var + 1e-3) * w + b)
    # The gradients read each row's statistics: x̂ = (x - s[0]) * s[1] + s[2].
    x, g = dist(mesh, a, "S0", "S1"), dist(mesh, rng.standard_normal((4, 6, 5)), "S1")
    stats = mf.ops.layer_norm_stats(x, eps=1e-3)
    s = stats.full_tensor()
    xhat = (a - mean) / np.sqrt(var + 1e-3)
    assert s.shape == (4, 6, 3)
    assert np.allclose((a - s[..., :1]) * s[..., 1:2] + s[..., 2:], xhat, rtol=1e-10, atol=1e-10)
    gn = g.full_tensor()
    gw = gn * w
    close(mf.ops.layer_norm_grad_x(g, x, dist(mesh, w), stats),
          (gw - gw.mean(-1, keepdims=True) - xhat * (gw * xhat).mean(-1, keepdims=True)) /
          np.sqrt(var + 1e-3))
    close(mf.ops.layer_norm_grad_w(g, x, stats), (gn * xhat).sum(axis=(0, 1)))
    table = rng.standard_normal((10, 3))
    ids = rng.integers(0, 10, size=(4, 5))
    close(mf.ops.embedding(dist(mesh, ids, "S0"), dist(mesh, table, "S0")), table[ids])
    q, k, v = (rng.standard_normal((2, 8, 4)) for _ in range(3))
    for causal in (False, True):
        s = q @ k.transpose(0, 2, 1) / 2.0
        if causal:
            s = np.where(np.triu(np.ones((8, 8), bool), 1), -np.inf, s)
        want = softmax(s) @ v
        close(mf.ops.attention(dist(mesh, q, "S0", "S1"), dist(mesh, k, "S1"), dist(mesh, v, "S2"),
                               causal=causal), want)


def test_operator_errors(mesh, rng):
    x = dist(mesh, rng.standard_normal((4, 3)), "S0")
    y = dist(mesh, rng.standard_normal((5, 3)), "S0")
    with pytest.raises(mf.ShapeMismatchError):
        x + y
    with pytest.raises(mf.InvalidArgumentError, match="attribute"):
        mf.ops.sum(x, axis=[0])
    with pytest.raises(mf.Error, match="unknown"):
        mf.ops.apply("conv", x)
    with pytest.raises(mf.ShapeMismatchError, match="cannot reshape 4x3"):
        mf.ops.reshape(x, shape=[5, 2])
    with pytest.raises(mf.InvalidArgumentError, match="not a permutation"):
        mf.ops.transpose(x, dims=[0, 0])
    ids = dist(mesh, np.array([1, 7]), "R")
    with pytest.raises(mf.InvalidArgumentError, match="id 7 is out of range for a table of 4 rows"):
        mf.ops.embedding(ids, x)
    other = mf.distribute_tensor(np.ones((4, 3)), mf.DeviceMesh(shape=(2,), devices=[0, 1]))
    with pytest.raises(mf.InvalidArgumentError, match="redistribute it first"):
        x * other
    assert np.allclose((x * 2).full_tensor(), x.full_tensor() * 2)  # still usable
