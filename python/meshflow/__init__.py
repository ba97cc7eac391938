"""meshflow: distributed tensors on a device mesh, with PyTorch DTensor's names.

One program for every device (as in JAX): in a plain ``python3`` the devices are threads of this
process and a DTensor holds every device's shard; under ``mpirun -n N python3 prog.py`` each
process is one device and a DTensor holds its own shard. The same code runs in both.
"""

from . import _meshflow
from ._meshflow import (  # noqa: F401  (re-exported)
    CommunicationError,
    Error,
    InternalError,
    InvalidArgumentError,
    IoError,
    ShapeMismatchError,
    TimeoutError,
    backend,
    rank,
)
from .placement import Partial, Placement, Replicate, Shard
from .tensor import DTensor, DeviceMesh, distribute_tensor, plan
from .model import Model, autoshard
from .torch_import import from_torch, to_torch_state_dict
from . import checkpoint, data, ops

__all__ = [
    "DTensor", "DeviceMesh", "Error", "Model", "Partial", "Placement", "Replicate", "Shard",
    "autoshard", "backend", "checkpoint", "distribute_tensor", "from_torch", "ops", "plan",
    "rank", "to_torch_state_dict",
]
