"""Datasets of model files with a "data" object (docs/data.md): the batches ``train`` feeds."""

from . import _meshflow
from .model import Model


def batches(model, steps=(1, 1), split="train"):
    """Returns the global batches ``Model.train`` feeds at steps a … b of ``steps = (a, b)``
    (``split="val"``: eval batches a − 1 … b − 1), one dict {input name: numpy.ndarray} per step:
    what ``meshflow data batches`` writes. ``model`` is a Model or a model file's path."""
    if not isinstance(model, Model):
        model = Model.load(model)
    a, b = steps
    return _meshflow.data_batches(model._h, int(a), int(b), str(split))
