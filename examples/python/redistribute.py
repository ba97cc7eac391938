"""Distribute a NumPy array, redistribute it, gather it back.

python3 examples/python/redistribute.py                 (devices are threads)
mpirun -n 4 python3 examples/python/redistribute.py     (each process one device)
"""

import numpy as np

import meshflow as mf
from meshflow import DeviceMesh, Replicate, Shard

mesh = DeviceMesh("2x2", mesh_dim_names=("dp", "tp"))
a = np.arange(42, dtype=np.float32).reshape(7, 6)  # uneven: 7 rows on 2 devices

x = mf.distribute_tensor(a, mesh, [Shard(0), Replicate()])
y = x.redistribute(placements=[Replicate(), Shard(1)])
assert np.array_equal(y.full_tensor(), a)
if mf.rank() == 0:
    print("backend", mf.backend(), "placements", y.placements)
    print("plan S(0),R -> R,S(1):",
          [s["kind"] for s in mf.plan(a.shape, mesh, x.placements, y.placements)["steps"]])
    print({d: s.shape for d, s in y.local_shards().items()})
