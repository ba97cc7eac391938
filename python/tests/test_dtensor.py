"""DTensor round trips, redistribution and errors against NumPy, on the process's backend."""

import numpy as np
import pytest

import meshflow as mf
from conftest import placements_of

SPECS = [("R", "R"), ("S0", "R"), ("S1", "R"), ("S0", "S1"), ("S1", "S0"), ("S0", "S0"), ("R", "S1")]
SHAPES = [(7, 5), (8, 8), (3, 2), (0, 4)]


def test_backend_and_rank():
    assert mf.backend() in ("threads", "mpi")
    if mf.backend() == "threads":
        assert mf.rank() == 0


def test_mesh_forms():
    m = mf.DeviceMesh("2x2", mesh_dim_names=("dp", "tp"))
    assert m.shape == (2, 2) and m.ndim == 2 and m.devices == [0, 1, 2, 3]
    assert m.mesh_dim_names == ("dp", "tp")
    o = mf.DeviceMesh(shape=(2, 2), devices=[3, 2, 1, 0])
    assert o.devices == [3, 2, 1, 0] and o != m
    assert str(mf.DeviceMesh(shape=4)) == "4"


def test_placement_text_and_equality():
    assert str(mf.Shard(0)) == "S(0)" and str(mf.Replicate()) == "R"
    assert str(mf.Partial("sum")) == "P(sum)" and str(mf.Partial()) == "P(sum)"
    assert mf.Shard(1) == mf.Shard(1) and mf.Shard(1) != mf.Shard(0)
    assert mf.Replicate() == mf.Replicate() and mf.Partial() != mf.Replicate()
    assert isinstance(mf.Shard(0), mf.Placement) and mf.Shard(0).is_shard(0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_round_trip(mesh, rng, shape, spec, dtype):
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    ps = placements_of(mesh, spec)
    x = mf.distribute_tensor(a, mesh, ps)
    assert x.placements == tuple(ps) and x.shape == shape and x.dtype == np.dtype(dtype)
    assert x.device_mesh == mesh
    got = x.full_tensor()
    assert got.dtype == a.dtype and np.array_equal(got, a)


@pytest.mark.parametrize("src", SPECS)
@pytest.mark.parametrize("dst", SPECS)
def test_redistribute_equals_numpy(mesh, rng, src, dst):
    a = rng.standard_normal((9, 6)).astype(np.float32)
    x = mf.distribute_tensor(a, mesh, placements_of(mesh, src))
    y = x.redistribute(placements=placements_of(mesh, dst))
    assert y.placements == tuple(placements_of(mesh, dst))
    assert np.array_equal(y.full_tensor(), a)


def test_shards_are_the_chunk_rule(rng):
    mesh = mf.DeviceMesh("4")
    a = rng.standard_normal((10, 3))
    x = mf.distribute_tensor(a, mesh, [mf.Shard(0)])
    shards = x.local_shards()
    rows = {0: (0, 3), 1: (3, 6), 2: (6, 9), 3: (9, 10)}  # ceil(10 / 4) = 3 per device
    for d, s in shards.items():
        lo, hi = rows[d]
        assert np.array_equal(s, a[lo:hi])
    if mf.backend() == "threads":
        assert sorted(shards) == [0, 1, 2, 3]
        assert np.array_equal(x.to_local(device=2), a[6:9])
        with pytest.raises(mf.Error, match="devices \\[0, 1, 2, 3\\]"):
            x.to_local()
    else:
        assert list(shards) == [mf.rank()]
        lo, hi = rows[mf.rank()]
        assert np.array_equal(x.to_local(), a[lo:hi])


def test_local_shards_are_read_only_views_that_outlive_the_dtensor(rng):
    a = rng.standard_normal((8, 3))
    x = mf.distribute_tensor(a, mf.DeviceMesh("4"), [mf.Shard(0)])
    shards = x.local_shards()
    d = next(iter(shards))
    view = shards[d]
    assert not view.flags.writeable and not view.flags.owndata  # no copy was made
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    del x, shards
    assert np.array_equal(view, a[2 * d:2 * d + 2])  # the view keeps the shard alive
    writable = view.copy()
    writable[0, 0] = 1.0


def test_partial_from_an_operator_reduces(mesh, rng):
    a = rng.standard_normal((8, 6))
    x = mf.distribute_tensor(a, mesh, placements_of(mesh, ("S0", "R")))
    s = mf.ops.sum(x, dims=[0])
    assert s.placements[0] == mf.Partial("sum")
    assert np.allclose(s.full_tensor(), a.sum(0))
    r = s.redistribute(placements=[mf.Replicate()] * mesh.ndim)
    assert np.allclose(r.full_tensor(), a.sum(0))


def test_cross_mesh_redistribute(rng):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    src = mf.DeviceMesh(shape=(2,), devices=[0, 1])
    dst = mf.DeviceMesh(shape=(2,), devices=[2, 3])
    x = mf.distribute_tensor(a, src, [mf.Shard(0)])
    y = x.redistribute(dst, [mf.Shard(1)])
    assert y.device_mesh == dst
    if mf.backend() == "threads" or mf.rank() in (2, 3):
        assert np.array_equal(y.full_tensor(), a)


def test_plan_counts_collectives():
    mesh = mf.DeviceMesh("2x2")
    p = mf.plan((8, 8), mesh, [mf.Shard(0), mf.Replicate()], [mf.Replicate(), mf.Replicate()])
    assert [s["kind"] for s in p["steps"]] == ["all_gather"]
    p = mf.plan((8, 8), mesh, [mf.Shard(0), mf.Shard(1)], [mf.Shard(0), mf.Shard(1)])
    assert p["steps"] == []
    p = mf.plan((8, 8), mesh, [mf.Shard(0), mf.Replicate()], [mf.Shard(1), mf.Replicate()],
                dtype="float64")
    assert [s["kind"] for s in p["steps"]] == ["all_to_all"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, a: mf.distribute_tensor(a, m, [mf.Shard(2), mf.Replicate()]), "S\\(2\\)"),
        (lambda m, a: mf.distribute_tensor(a, m, [mf.Partial(), mf.Replicate()]), "P\\(sum\\)"),
        (lambda m, a: mf.distribute_tensor(a, m, [mf.Shard(0)]), "placements"),
        (lambda m, a: mf.distribute_tensor(a.astype(np.complex64), m), "complex64"),
        (lambda m, a: mf.DeviceMesh("2x"), "2x"),
        (lambda m, a: mf.DeviceMesh(shape=(2, 2), devices=[0, 1, 2]), "devices"),
    ],
    ids=["shard_dim", "partial", "placement_count", "dtype", "mesh_text", "mesh_devices"],
)
def test_errors_are_exceptions(call, message):
    mesh = mf.DeviceMesh("2x2")
    a = np.arange(12.0).reshape(4, 3)
    with pytest.raises(mf.Error, match=message) as info:
        call(mesh, a)
    assert isinstance(info.value, ValueError)


def test_partial_target_is_refused(rng):
    mesh = mf.DeviceMesh("4")
    x = mf.distribute_tensor(rng.standard_normal((4, 4)), mesh, [mf.Shard(0)])
    with pytest.raises(mf.InvalidArgumentError, match="Partial"):
        x.redistribute(placements=[mf.Partial()])
    # The devices still work after a refused call.
    assert x.redistribute(placements=[mf.Replicate()]).full_tensor().shape == (4, 4)
