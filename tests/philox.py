"""DESIGN.md's generator in NumPy, for the tests that reproduce meshflow's seeded values: the
initialisers (cli_model_test.py) and the batch orders (cli_data_test.py)."""
import numpy as np


def philox(counter, key0, key1=0):
    """Philox4x32-10 of counters (counter mod 2^32, counter >> 32, 0, 0) under key (key0, key1),
    elementwise over the uint64 array `counter`; returns words w0, w1."""
    m0, m1, w0, w1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), 0x9E3779B9, 0xBB67AE85
    mask = np.uint64(0xFFFFFFFF)
    counter = counter.astype(np.uint64)
    c = [counter & mask, counter >> np.uint64(32), np.zeros_like(counter),
         np.zeros_like(counter)]
    k = [key0 & 0xFFFFFFFF, key1 & 0xFFFFFFFF]
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k[0]), p1 & mask,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k[1]), p0 & mask]
        k = [(k[0] + w0) & 0xFFFFFFFF, (k[1] + w1) & 0xFFFFFFFF]
    return c[0], c[1]
