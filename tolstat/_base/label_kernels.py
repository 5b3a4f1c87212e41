"""numba kernels of :func:`tolstat._base.util.factorize`: a hash per fixed-width label and
the exact check that every label equals its group's first one.

Kept out of :mod:`tolstat._base.util` so that importing the grouping helpers does not
import numba; loaded on first use, for arrays of at least
:data:`tolstat._base.util._FACTORIZE_MIN` strings.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["row_hashes", "rows_equal_first", "mix_row_hashes"]


@numba.njit(cache=True)
def row_hashes(units: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """FNV-1a over the code units of each row of ``units`` (2-D, unsigned integers): one
    64-bit hash per label, no temporary arrays."""
    n, w = units.shape
    out = np.empty(n, dtype=np.uint64)
    prime = np.uint64(1099511628211)
    for i in range(n):
        h = np.uint64(14695981039346656037)
        for j in range(w):
            h = (h ^ np.uint64(units[i, j])) * prime
        out[i] = h
    return out


@numba.njit(cache=True)
def rows_equal_first(units: np.ndarray, first: np.ndarray, codes: np.ndarray) -> bool:  # pragma: no cover - numba
    """True when every row ``i`` equals row ``first[codes[i]]`` code unit for code unit."""
    n, w = units.shape
    for i in range(n):
        r = first[codes[i]]
        if r == i:
            continue
        for j in range(w):
            if units[i, j] != units[r, j]:
                return False
    return True


@numba.njit(cache=True)
def mix_row_hashes(h: np.ndarray, part: np.ndarray) -> None:  # pragma: no cover - numba
    """Fold each row of ``part`` (2-D unsigned integers: uint64 words, or uint8 bytes for a
    width that is no multiple of 8) into ``h`` (one uint64 per row), in place: per code
    unit ``x = (x ^ c) * prime; x ^= x >> 29``, then the row's width, so that columns of
    other widths differ."""
    n, w = part.shape
    prime = np.uint64(0x100000001B3)
    s29 = np.uint64(29)
    for i in range(n):
        x = h[i]
        for j in range(w):
            x = (x ^ np.uint64(part[i, j])) * prime
            x ^= x >> s29
        h[i] = (x ^ np.uint64(w)) * prime
