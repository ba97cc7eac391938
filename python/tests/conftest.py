"""Shared fixtures: the same tests run on threads (plain python3) and under mpirun -n 4."""

import zlib

import numpy as np
import pytest

import meshflow as mf


@pytest.fixture(params=["4", "2x2"])
def mesh(request):
    return mf.DeviceMesh(request.param)


@pytest.fixture
def rng(request):
    # Every process draws the same data: the seed depends on the test only.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def placements_of(mesh, kinds):
    """Returns placements for `mesh` from a spec like ("S0", "R")."""
    out = []
    for k in kinds[: mesh.ndim]:
        out.append(mf.Shard(int(k[1:])) if k.startswith("S") else mf.Replicate())
    while len(out) < mesh.ndim:
        out.append(mf.Replicate())
    return out
