"""The tensor-parallel MLP forward (Megatron): column-parallel w1, row-parallel w2.

The hidden activation stays sharded on its columns; the second product is a Partial(sum) that
full_tensor reduces. Equal to NumPy's single-device forward.
"""

import numpy as np

import meshflow as mf
from meshflow import DeviceMesh, Replicate, Shard

rng = np.random.default_rng(0)
x = rng.standard_normal((16, 8))
w1, w2 = rng.standard_normal((8, 32)), rng.standard_normal((32, 8))

mesh = DeviceMesh("4", mesh_dim_names=("tp",))
X = mf.distribute_tensor(x, mesh, [Replicate()])
W1 = mf.distribute_tensor(w1, mesh, [Shard(1)])
W2 = mf.distribute_tensor(w2, mesh, [Shard(0)])

h = mf.ops.relu(X @ W1)  # S(1): each device its hidden columns
y = h @ W2               # P(sum): each device a term
want = np.maximum(x @ w1, 0) @ w2
got = y.full_tensor()  # collective under mpi: every process calls it
assert np.allclose(got, want)
if mf.rank() == 0:
    print("h", h.placements, "y", y.placements, "max error", np.abs(got - want).max())
