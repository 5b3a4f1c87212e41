"""numba kernel of :func:`tolstat.measure.noise.statistics_of_pass`: the noise scales of
both noise shapes an op's invariants read, and where each is finite, in one pass.

:func:`tolstat.measure.noise.noise_scale` builds one shape's scale in four numpy passes and
the invariants' mask in three more, per shape; this kernel makes both shapes' scales and
masks element by element with the same operations in the same order (so the same bits, with
``1.0`` where the pair or the scale is not finite, as the invariants take them).
"""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["invariant_scales"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True, inline="always")
def _scale(aref: float, mv: float, coef: tuple) -> float:  # pragma: no cover - numba
    """:func:`~tolstat.measure.noise.noise_scale` of one element, ``((A |e|) + B m) [+ C m] + D``:
    its operations in its order (the ``C`` term only where ``C`` is not 0, as it adds it
    only for a nonzero ``c_mid``)."""
    A, B, C, D = coef
    v = A * aref + B * mv
    if C != 0.0:
        v = v + C * mv
    return v + D


@numba.njit(cache=True, nogil=True)
def invariant_scales(a: np.ndarray, e: np.ndarray, m: np.ndarray, has_m: bool, coef_plain: tuple,
                     coef_mid: tuple, s0: np.ndarray, s1: np.ndarray, ok0: np.ndarray,
                     ok1: np.ndarray) -> tuple:  # pragma: no cover - numba
    """``s0``/``s1``: the noise scales of the plain and the intermediate-store shapes
    (:func:`_scale` with ``coef = (A, B, C, D)``; ``m = |magnitude|``, or ``|e|`` without
    one), set to 1.0 where ``ok`` is False; ``ok0``/``ok1``: ``isfinite(a - e) &
    isfinite(s)``. Returns whether each mask is all True."""
    all0 = True
    all1 = True
    for i in range(e.size):
        ev = e[i]
        aref = abs(ev)
        mv = abs(m[i]) if has_m else aref
        fin = np.isfinite(a[i] - ev)
        v = _scale(aref, mv, coef_plain)
        ok = fin and np.isfinite(v)
        ok0[i] = ok
        s0[i] = v if ok else 1.0
        all0 = all0 and ok
        v = _scale(aref, mv, coef_mid)
        ok = fin and np.isfinite(v)
        ok1[i] = ok
        s1[i] = v if ok else 1.0
        all1 = all1 and ok
    return all0, all1
