#!/usr/bin/python3
"""Writes the example models' input data (seeded, so the files never change): run it from any
folder; the .npy files land beside this script."""
import pathlib

import numpy as np

here = pathlib.Path(__file__).resolve().parent
rng = np.random.default_rng(2026)


def save(name, array):
    np.save(here / name, array)


# The MLPs: 64 samples of 32 features, 10 classes.
save("x.npy", rng.standard_normal((64, 32)).astype(np.float32))
save("y.npy", rng.integers(0, 10, size=64).astype(np.int64))
# FlexFlow's end-to-end graphs: an 8x6 target for the mse loss.
save("target.npy", rng.standard_normal((8, 6)).astype(np.float32))
save("target4.npy", rng.standard_normal((8, 4)).astype(np.float32))
# The attention block: 4 sequences of 8 tokens from a vocabulary of 16, and the next tokens.
save("tokens.npy", rng.integers(0, 16, size=(4, 8)).astype(np.int64))
save("next_tokens.npy", rng.integers(0, 16, size=32).astype(np.int64))
