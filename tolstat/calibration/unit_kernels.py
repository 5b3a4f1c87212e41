"""numba kernels of the calibration units (:mod:`tolstat.calibration.units`): which
statistics a group's units carry, and each unit's combined score ``max_j T_j / q_j``, in
one pass over the (units, statistics) matrix without temporaries of its size."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["nan_layout", "scaled_row_max"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def nan_layout(v: np.ndarray, has: np.ndarray) -> int:  # pragma: no cover - numba
    """``has[j]``: some row of ``v`` has a value (not NaN) in column ``j``; returns how
    many rows have none at all."""
    n, k = v.shape
    has[:] = False
    empty = 0
    for i in range(n):
        row = False
        for j in range(k):
            if v[i, j] == v[i, j]:
                has[j] = True
                row = True
        if not row:
            empty += 1
    return empty


@numba.njit(cache=True, nogil=True)
def scaled_row_max(v: np.ndarray, rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """``out[k] = nanmax_j v[rows[k], j] / q[j]`` (NaN where the row has no value): the
    quotients of ``v / q`` and the largest of them, skipping NaN as ``numpy.fmax`` does
    (the first of equal values kept)."""
    m = v.shape[1]
    for k in range(rows.size):
        i = rows[k]
        acc = np.nan
        for j in range(m):
            x = v[i, j] / q[j]
            if acc != acc or x > acc:
                if x == x:
                    acc = x
        out[k] = acc
