"""numba kernel of the ``max_score`` statistic of an error dataset's runs under an affine
noise scale (:func:`tolstat.models.statistics._score_from_dataset`): per run, the largest
element-sample error over its scale, read in place from the dataset's sample arrays (the
runs by position, no copy of a group). Kept apart from the xarray layer."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["affine_max_scores"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def affine_max_scores(abs_s: np.ndarray, ref_s: np.ndarray, n_sample: np.ndarray, rows: np.ndarray,
                      coef: np.ndarray, add: np.ndarray, mult: np.ndarray,
                      out: np.ndarray) -> None:  # pragma: no cover - numba
    """``out[k] = max_j abs_s[rows[k], j] / s`` over the first ``n_sample[k]`` slots, with
    ``s = max(unit * (atol + rtol * ref_s[rows[k], j] + add[k]) * mult[k], tiny)`` and
    ``coef = (unit, atol, rtol, tiny)``.

    The operations of :meth:`tolstat.models.ScaleModel.scale` and numpy's masked maximum
    (``numpy.where(mask, abs / s, -inf).max(axis=1)``), in the same order, so the same
    bits: a NaN quotient makes the run's value NaN, a run with no slot gets ``-inf``, and
    ``s`` is NaN where the scale is (``numpy.maximum`` keeps a NaN)."""
    unit, atol, rtol, tiny = coef[0], coef[1], coef[2], coef[3]
    w = abs_s.shape[1]
    for k in range(rows.size):
        i = rows[k]
        a, m = add[k], mult[k]
        best = -np.inf
        nan = False
        for j in range(min(n_sample[k], w)):
            s = (unit * ((atol + rtol * ref_s[i, j]) + a)) * m
            if s < tiny:  # numpy.maximum(s, tiny): a NaN stays NaN
                s = tiny
            v = abs_s[i, j] / s
            if v != v:
                nan = True
            elif v > best:
                best = v
        out[k] = np.nan if nan else best
