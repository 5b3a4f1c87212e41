"""numba kernels of :func:`tolstat._base.util.factorize` (a hash per fixed-width label and
the exact check that every label equals its group's first one) and of
:func:`tolstat._base.validate.duplicate_rows` (row hashes folded column by column, and which
hashes occur more than once).

Kept out of :mod:`tolstat._base.util` so that importing the grouping helpers does not
import numba; loaded on first use, for arrays of at least
:data:`tolstat._base.util._FACTORIZE_MIN` strings.
"""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["row_hashes", "rows_equal_first", "mix_row_hashes", "shared_hashes"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


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


@numba.njit(cache=True)
def shared_hashes(h: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """For each value of ``h`` (uint64), whether another element holds the same value.

    A bitmap of at most 2^25 bits (4 MiB) indexed by up to 25 high bits of each
    value first marks the positions hit twice; only the elements at such positions are
    looked up in an open-addressing table (value equality). No sort, no table of every
    distinct value."""
    n = h.size
    nbits = 64
    while nbits < 8 * n and nbits < (1 << 25):
        nbits *= 2
    bmask = np.uint64(nbits - 1)
    seen = np.zeros(nbits >> 3, dtype=np.uint8)
    twice = np.zeros(nbits >> 3, dtype=np.uint8)
    for i in range(n):
        b = np.int64((h[i] >> np.uint64(39)) & bmask)
        bit = np.uint8(1 << (b & 7))
        if seen[b >> 3] & bit:
            twice[b >> 3] |= bit
        else:
            seen[b >> 3] |= bit
    cand = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        b = np.int64((h[i] >> np.uint64(39)) & bmask)
        if twice[b >> 3] & np.uint8(1 << (b & 7)):
            cand[m] = i
            m += 1
    size = 2
    while size < 2 * m:
        size *= 2
    mask = np.uint64(size - 1)
    first = np.full(size, -1, dtype=np.int64)
    out = np.zeros(n, dtype=np.bool_)
    for k in range(m):
        i = cand[k]
        x = h[i]
        j = np.int64(x & mask)
        while True:
            r = first[j]
            if r < 0:
                first[j] = i
                break
            if h[r] == x:
                out[i] = True
                out[r] = True
                break
            j = (j + 1) & (size - 1)
    return out
