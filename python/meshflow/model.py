"""Model files (DESIGN's "Models"): load, run, train and explain from Python."""

from . import _meshflow


class Model:
    """A model file. ``Model.load(path)``; ``.run()``, ``.train(steps)``, ``.explain()``."""

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def load(cls, path):
        return cls(_meshflow.load_model(str(path)))

    def run(self, overlap=False):
        """Runs the forward pass; returns {name: numpy.ndarray} of the model's outputs."""
        return _meshflow.run_model(self._h, overlap)

    def train(self, steps, lr=0.1, check=False, overlap=False):
        """Trains ``steps`` SGD steps; returns the dict ``meshflow train --json`` prints."""
        return _meshflow.train_model(self._h, int(steps), float(lr), bool(check), overlap)

    def explain(self, overlap=False):
        """Returns the dict ``meshflow explain --json`` prints."""
        return _meshflow.explain_model(self._h, overlap)
