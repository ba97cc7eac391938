"""Checkpoints written by ``Model.train(..., checkpoint=DIR)`` (``meshflow train --checkpoint``)."""

from . import _meshflow


def list(dir, verify=False):  # noqa: A001  (the name DESIGN gives it)
    """Returns the dict ``meshflow checkpoint DIR --json`` prints: {"checkpoints": [{"step",
    "path", "bytes", "tensors": {name: {"shape", "dtype", "layout"}}, "verified"}]}, the complete
    checkpoints in ``dir`` by step; with ``verify`` every file is checked against its sha256
    ("verified" is then True or False, else None)."""
    return _meshflow.list_checkpoints(str(dir), bool(verify))
