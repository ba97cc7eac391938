#!/usr/bin/python3
"""Fits the rational functions of vector_math_simd.h's GELU loops and prints their coefficients.

  Φ(x) - 1/2 = x P(x²) / Q(x²),            degrees (5, 5) in x², x in [-5.5, 5.5]
  Φ(x) + x φ(x) - 1/2 = x P(x²) / Q(x²),   degrees (6, 7) in x², x in [-6.5, 6.5]

Q(0) = 1. Lawson's iteration on a linearised least-squares fit (each pass weighted by the last
pass's 1/Q), minimising the largest absolute error of the left side on 4,000 points of x, in
float64 (NumPy only). Usage: fit_gelu.py  (prints each fit's error and its coefficients, highest
power first, as the loops list them).
"""
import math

import numpy as np

ERF = np.vectorize(math.erf)


def cdf_centred(x):
    return 0.5 * ERF(x / math.sqrt(2))


def slope_centred(x):
    return cdf_centred(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def fit(f, limit, m, k, passes=200):
    x = np.linspace(1e-4, limit, 4000)
    t = x * x / (limit * limit)  # x² scaled to [0, 1] for the fit's conditioning
    target = f(x) / x
    weight, last_q, best = np.ones_like(x), np.ones_like(x), None
    for _ in range(passes):
        columns = [t**i for i in range(m + 1)] + [-target * t**i for i in range(1, k + 1)]
        w = (weight * x / last_q)[:, None]
        c = np.linalg.lstsq(np.stack(columns, axis=1) * w, target * w[:, 0], rcond=None)[0]
        p, q = c[: m + 1], np.concatenate([[1.0], c[m + 1 :]])
        last_q = sum(q[i] * t**i for i in range(k + 1))
        error = x * (target - sum(p[i] * t**i for i in range(m + 1)) / last_q)
        worst = np.max(np.abs(error))
        if best is None or worst < best[0]:
            best = (worst, p.copy(), q.copy())
        weight = np.maximum(weight * np.abs(error) / np.mean(weight * np.abs(error)), 1e-12)
    worst, p, q = best
    scale = limit * limit
    unscaled = lambda c: [float(np.float32(c[i] / scale**i)) for i in reversed(range(len(c)))]
    return worst, unscaled(p), unscaled(q)


if __name__ == "__main__":
    for name, f, limit, m, k in (("Φ(x) - 1/2", cdf_centred, 5.5, 5, 5),
                                 ("Φ(x) + x φ(x) - 1/2", slope_centred, 6.5, 6, 7)):
        worst, p, q = fit(f, limit, m, k)
        print(f"{name} on [-{limit}, {limit}], degrees ({m}, {k}) in x²: error {worst:.3g}")
        print("  P:", ", ".join(f"{v!r}f" for v in p))
        print("  Q:", ", ".join(f"{v!r}f" for v in q))
