"""DeviceMesh, DTensor and the functions that make and move them."""

import numpy as np

from . import _meshflow
from .placement import from_text, to_text


class DeviceMesh:
    """A logical n-d array of devices.

    ``DeviceMesh("2x2", mesh_dim_names=("dp", "tp"))`` or
    ``DeviceMesh(shape=(2, 2), devices=[4, 5, 6, 7])``.
    """

    def __init__(self, mesh=None, mesh_dim_names=None, *, shape=None, devices=None):
        names = list(mesh_dim_names or [])
        if isinstance(mesh, _meshflow._Mesh):
            self._m = mesh
        elif isinstance(mesh, str):
            if shape is not None or devices is not None:
                raise ValueError("DeviceMesh takes a text form or shape=/devices=, not both")
            self._m = _meshflow._Mesh(mesh, names)
        else:
            if shape is None:
                raise ValueError('DeviceMesh needs a text form ("2x2") or shape=')
            if isinstance(shape, int):
                shape = (shape,)
            self._m = _meshflow._Mesh([int(s) for s in shape], [int(d) for d in devices or []], names)

    @property
    def shape(self):
        return self._m.shape

    @property
    def ndim(self):
        return len(self._m.shape)

    @property
    def devices(self):
        return list(self._m.devices)

    @property
    def mesh_dim_names(self):
        names = self._m.names
        return tuple(names) if names else None

    def size(self, mesh_dim=None):
        if mesh_dim is None:
            return len(self._m.devices)
        return self._m.shape[mesh_dim]

    def __eq__(self, other):
        return isinstance(other, DeviceMesh) and self._m == other._m

    def __hash__(self):
        return hash((str(self._m), self.mesh_dim_names))

    def __str__(self):
        return str(self._m)

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh({str(self._m)!r}{names})"


def _wrap(t):
    out = DTensor.__new__(DTensor)
    out._t = t
    return out


class DTensor:
    """A tensor laid out on a device mesh. Make one with distribute_tensor."""

    __slots__ = ("_t",)
    __array_priority__ = 1000  # numpy_array + dtensor defers to DTensor.__radd__

    def __init__(self, *args, **kwargs):
        raise TypeError("make a DTensor with meshflow.distribute_tensor")

    @property
    def placements(self):
        return from_text(self._t.placements)

    @property
    def device_mesh(self):
        return DeviceMesh(self._t.mesh)

    @property
    def shape(self):
        return self._t.shape

    @property
    def ndim(self):
        return len(self._t.shape)

    @property
    def dtype(self):
        return self._t.dtype

    def full_tensor(self):
        """Returns the global tensor as a NumPy array (collective under mpi)."""
        return self._t.full()

    def redistribute(self, device_mesh=None, placements=None):
        """Returns the tensor laid out as ``placements`` on ``device_mesh`` (default: its own)."""
        mesh = self._t.mesh if device_mesh is None else device_mesh._m
        if placements is None:
            placements = self.placements
        return _wrap(self._t.redistribute(mesh, to_text(placements)))

    def to_local(self, device=None):
        """This process's shard (mpi) or device ``device``'s (threads, where one process holds
        every device's shard)."""
        if device is None:
            held = self._t.devices()
            if len(held) != 1:
                raise _meshflow.InvalidArgumentError(
                    f"to_local: this process holds the shards of devices {held}; "
                    f"name one with to_local(device=d)")
            device = held[0]
        return self._t.shard(device)

    def local_shards(self):
        """Returns {device: shard} for the shards this process holds."""
        return {d: self._t.shard(d) for d in self._t.devices()}

    def __repr__(self):
        return f"DTensor(shape={self.shape}, dtype={self.dtype}, layout={self._t.layout})"

    def _binary(self, name, other, reflected=False):
        if isinstance(other, DTensor):
            other = other._t
        elif isinstance(other, np.ndarray):
            return NotImplemented
        return _wrap(self._t.binary(name, other, reflected))

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("sub", o)

    def __rsub__(self, o):
        return self._binary("sub", o, True)

    def __mul__(self, o):
        return self._binary("mul", o)

    def __rmul__(self, o):
        return self._binary("mul", o, True)

    def __truediv__(self, o):
        return self._binary("div", o)

    def __rtruediv__(self, o):
        return self._binary("div", o, True)

    def __matmul__(self, o):
        if not isinstance(o, DTensor):
            return NotImplemented
        return _wrap(_meshflow.apply("matmul", [self._t, o._t], {}))

    def __neg__(self):
        return _wrap(_meshflow.apply("neg", [self._t], {}))


def distribute_tensor(array, device_mesh, placements=None):
    """Returns ``array`` (a NumPy array, the same on every process) laid out as ``placements``
    (default all Replicate) on ``device_mesh``. Partial placements are refused, as DTensor's are."""
    if placements is None:
        placements = ["R"] * device_mesh.ndim
        text = ",".join(placements)
    else:
        text = to_text(placements)
    return _wrap(_meshflow.distribute(np.asarray(array), device_mesh._m, text))


def plan(shape, device_mesh, src_placements, dst_placements, dst_mesh=None, dtype="float32"):
    """Returns the redistribution plan as ``meshflow plan --json`` prints it."""
    return _meshflow.plan([int(s) for s in shape], device_mesh._m, to_text(src_placements),
                          to_text(dst_placements), None if dst_mesh is None else dst_mesh._m,
                          str(np.dtype(dtype)))
