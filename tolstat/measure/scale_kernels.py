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


@numba.njit(cache=True, nogil=True)
def invariant_scales(a: np.ndarray, e: np.ndarray, m: np.ndarray, has_m: bool, coef_plain: tuple,
                     coef_mid: tuple, s0: np.ndarray, s1: np.ndarray, ok0: np.ndarray,
                     ok1: np.ndarray) -> tuple:  # pragma: no cover - numba
    """``s0``/``s1``: :func:`~tolstat.measure.noise.noise_scale` of the plain and the
    intermediate-store shapes, ``((A |e|) + B m) [+ C m] + D`` with ``coef = (A, B, C, D)``
    (``m = |magnitude|``, or ``|e|`` without one; the ``C`` term only where ``C`` is not
    0, as ``noise_scale`` adds it only for a nonzero ``c_mid``), set to 1.0 where
    ``ok`` is False; ``ok0``/``ok1``: ``isfinite(a - e) & isfinite(s)``. Returns whether
    each mask is all True."""
    A0, B0, C0, D0 = coef_plain
    A1, B1, C1, D1 = coef_mid
    all0 = True
    all1 = True
    for i in range(e.size):
        ev = e[i]
        aref = abs(ev)
        mv = abs(m[i]) if has_m else aref
        fin = np.isfinite(a[i] - ev)
        v = A0 * aref + B0 * mv
        if C0 != 0.0:
            v = v + C0 * mv
        v = v + D0
        ok = fin and np.isfinite(v)
        ok0[i] = ok
        s0[i] = v if ok else 1.0
        all0 = all0 and ok
        v = A1 * aref + B1 * mv
        if C1 != 0.0:
            v = v + C1 * mv
        v = v + D1
        ok = fin and np.isfinite(v)
        ok1[i] = ok
        s1[i] = v if ok else 1.0
        all1 = all1 and ok
    return all0, all1
