"""Datasets (docs/data.md): text tokenized into a dataset, token ids to and from text, and the
batches ``train`` feeds a model file with a "data" object."""

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


def prepare(text, out, tokenizer="bytes", vocab_size=4096, val_fraction=0.1, separator=None):
    """``meshflow data prepare``: tokenizes the UTF-8 files ``text`` (a path or a list,
    concatenated in order) into ``out``/train.npy and val.npy with the tokenizer ("bytes", or
    "bpe": a SentencePiece model of ``vocab_size`` pieces); with ``separator`` every
    ceil(1/val_fraction)-th document is val, else the last val_fraction of the tokens. Returns
    {"train_tokens", "val_tokens", "bytes_per_token"}."""
    one = isinstance(text, (str, bytes)) or hasattr(text, "__fspath__")
    paths = [str(text)] if one else [str(t) for t in text]
    return _meshflow.data_prepare(paths, str(out), str(tokenizer), int(vocab_size),
                                  float(val_fraction), None if separator is None else str(separator))


def encode(text, tokenizer):
    """Returns the token ids of ``text`` (a str, or bytes) with the tokenizer in folder
    ``tokenizer`` (``data prepare``'s output)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return _meshflow.data_encode(str(tokenizer), data)


def decode(ids, tokenizer):
    """Returns the text of ``ids``: a str, or bytes where they are not valid UTF-8 (the bytes
    tokenizer decodes any byte sequence)."""
    data = _meshflow.data_decode(str(tokenizer), [int(i) for i in ids])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data
