"""numba kernels of :func:`tolstat.dataset.schema.validate`: the checks of the element
sample in one pass over it.

Kept apart from the xarray layer (:mod:`tolstat.dataset.schema` imports this module only
for a deep check of in-memory data).
"""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["sample_checks"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True)
def sample_checks(s: np.ndarray, ns: np.ndarray) -> tuple[bool, bool, np.ndarray]:  # pragma: no cover - numba
    """One pass over a ``(runs, sample)`` element sample and its valid counts ``ns``:

    whether any value is negative, whether any of the first ``ns[i]`` values of a row is
    NaN, and each row's largest value ignoring NaN (``-inf`` for a row with none)."""
    n, w = s.shape
    neg = False
    nan_inside = False
    mx = np.full(n, -np.inf)
    for i in range(n):
        k = ns[i]
        m = -np.inf
        for j in range(w):
            x = s[i, j]
            if x != x:
                if j < k:
                    nan_inside = True
            else:
                if x < 0:
                    neg = True
                if x > m:
                    m = x
        mx[i] = m
    return neg, nan_inside, mx
