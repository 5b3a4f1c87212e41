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
