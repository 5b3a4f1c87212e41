"""Test kernels whose rounding is the same on every machine."""

from __future__ import annotations

import numpy as np


def fp16_block_matmul(a: np.ndarray, b: np.ndarray, block: int = 16) -> np.ndarray:
    """``a @ b`` of float16-rounded operands with a float16 accumulator over K-blocks of
    ``block``, each block summed exactly (in float64): K <= ``block`` is correctly rounded,
    a longer K is not. A float32 BLAS product rounded to float16 depends on the CPU's
    kernel and is nearly always correctly rounded on some (AVX-512 OpenBLAS), which leaves
    thresholds of 0 and normalisers near 0."""
    a = np.asarray(a).astype(np.float16).astype(np.float64)
    b = np.asarray(b).astype(np.float16).astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k0 in range(0, a.shape[1], block):
        acc = (acc.astype(np.float64) + a[:, k0:k0 + block] @ b[k0:k0 + block]).astype(np.float16)
    return acc


def op_reference(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    """A float64 reference of ``n`` values for the operator passes' equivalence tests:
    ``normal``; ``heavy`` (heavy-tailed, beyond float16's range); ``wide`` (600 decades:
    subnormals of every format, values beyond every small format); ``grid`` (representable
    values: ties of the rounding, exact outputs); else half zeros, some of them -0."""
    if kind == "normal":
        return rng.standard_normal(n) * 8.0
    if kind == "heavy":
        return rng.standard_t(1.2, n) * 30.0
    if kind == "wide":
        return rng.standard_normal(n) * 10.0 ** rng.uniform(-310, 300, n)
    if kind == "grid":
        return np.round(rng.standard_normal(n) * 16) / 16
    z = rng.standard_normal(n)
    z[rng.random(n) < 0.5] = 0.0
    z[rng.random(n) < 0.1] = -0.0
    return z


def rounding_probe_values(td, rng: np.random.Generator) -> np.ndarray:
    """float64 values that probe a rounding to the format ``td`` (a ``TargetDtype``): every
    finite value of a format of at most 16 bits (a sample of a wider one), every midpoint
    between neighbours and the numbers next to it, 600 decades of random values, values
    beyond the range, the smallest float64 subnormals, signed zeros and non-finite values."""
    if td.bits <= 16:
        codes = np.arange(2 ** td.bits, dtype=np.uint16 if td.bits == 16 else np.uint8)
        with np.errstate(invalid="ignore"):
            vals = codes.view(td.np_dtype).astype(np.float64)
    else:
        vals = rng.standard_normal(20_000).astype(td.np_dtype).astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[:-1] + vals[1:]) / 2
    return np.concatenate([vals, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                           rng.standard_normal(20_000) * 10.0 ** rng.uniform(-320, 300, 20_000),
                           [td.max * 1.0001, -td.max * 1.04, 1e300, 5e-324, -5e-324, 0.0, -0.0, np.inf, -np.inf,
                            np.nan]])
