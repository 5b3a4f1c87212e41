"""numba kernels of the built-in op invariants (:mod:`tolstat.measure.invariants`) for both
noise shapes at once, without the arrays of the output's size that the numpy definition
builds (the two shapes' scales and masks, the masked difference, the weights).

Element by element they take the operations of
:func:`tolstat.measure.scale_kernels.invariant_scales` (the scale of each shape, 1.0 where the
pair or the scale is not finite) and of :func:`tolstat.measure.invariants.invariant_values`
(an output element whose pair or scale is not finite replaced by the reference; an element
whose difference is still not finite left out of the row's sums). The row sums are
reassociated (the loops vectorise) where numpy sums pairwise, so a projection equals the
numpy definition up to the rounding of its sums (tested to 1e-12 relative); a count is
exact. A float16 or bfloat16 output is read as its bit patterns and decoded exactly.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache
from tolstat._base.cast_kernels import decode16
from tolstat.measure.scale_kernels import _scale

__all__ = ["W_DIFF", "W_EXP_REF", "W_REF", "W_REF_CENTRED", "row_projections"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

#: the weights ``w`` of a projection ``|sum_j w_j d_j| / sqrt(sum_j (w_j s_j)^2)`` over a row:
#: none (``w = 1``), ``exp(e)``, ``e - mean(e)`` over the row, ``e``
W_DIFF, W_EXP_REF, W_REF_CENTRED, W_REF = 0, 1, 2, 3


@numba.njit(cache=True, nogil=True)
def row_projections(a: np.ndarray, e: np.ndarray, m: np.ndarray, has_m: bool, coefs: tuple, rowlen: int,
                    wkind: int, count_zero: bool, out: np.ndarray,
                    d16: tuple = (False, 0, 1.0, 0)) -> None:  # pragma: no cover - numba
    """``out[k]``: the largest over the rows (``rowlen`` consecutive elements of the flat
    ``a``, ``e``, ``m``) of ``t = |sum_j w_j d_j| / sqrt(sum_j (w_j s_j)^2)`` (0 where the
    numerator is 0, inf where only the denominator is, NaN where either is NaN) for the
    plain (``k = 0``) and the intermediate-store (``k = 1``) noise shape, ``s`` the shape's
    scale and ``d = x - e`` with ``x`` the output where ``a - e`` and ``s`` are finite and
    the reference elsewhere (an element whose ``d`` is not finite is left out). With
    ``count_zero``, ``out[2 + k]`` is also, in the same pass, the count of shape ``k`` of the
    elements with ``e == 0`` and ``x != 0`` (the masked-zero invariant).

    ``coefs`` is ``(coef_plain, coef_mid)``, each shape's ``(A, B, C, D)``. ``a`` is float64,
    or with ``d16 = (True, shift, scale, special)`` the bit patterns (uint16) of a float16 or
    bfloat16 output, decoded exactly by :func:`tolstat._base.cast_kernels.decode16` (no widened
    copy of the output)."""
    coef_plain, coef_mid = coefs
    dec16, shift, scale, special = d16
    n = e.size
    c0 = 0
    c1 = 0
    best0 = 0.0
    best1 = 0.0
    nan0 = False
    nan1 = False
    for r0 in range(0, n, rowlen):
        r1 = min(r0 + rowlen, n)
        num0, den0, num1, den1, k0, k1 = _row_sums(a[r0:r1], e[r0:r1], m[r0:r1], has_m, coef_plain, coef_mid,
                                                   wkind, count_zero, dec16, shift, scale, special)
        c0 += k0
        c1 += k1
        t0 = _ratio(abs(num0), math.sqrt(den0))
        t1 = _ratio(abs(num1), math.sqrt(den1))
        if t0 != t0:
            nan0 = True
        elif t0 > best0:
            best0 = t0
        if t1 != t1:
            nan1 = True
        elif t1 > best1:
            best1 = t1
    out[0] = np.nan if nan0 else best0
    out[1] = np.nan if nan1 else best1
    if count_zero:
        out[2] = c0
        out[3] = c1


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _row_sums(a: np.ndarray, e: np.ndarray, m: np.ndarray, has_m: bool, coef_plain: tuple, coef_mid: tuple,
              wkind: int, count_zero: bool, dec16: bool, shift: int, scale: float,
              special: int) -> tuple:  # pragma: no cover - numba
    """The sums of one row of :func:`row_projections`: ``(num0, den0, num1, den1, count0,
    count1)``. The row's arrays are slices (indices from 0, so that the loop carries no
    negative-index test) and the sums may be reassociated: the loop vectorises, about five
    times faster than a sequential sum (the values differ from a sequential sum by the
    rounding of the sums, as numpy's pairwise sums do)."""
    mean = 0.0
    if wkind == W_REF_CENTRED:
        acc = 0.0
        for i in range(e.size):
            acc += e[i]
        mean = acc / e.size
    num0 = 0.0
    den0 = 0.0
    num1 = 0.0
    den1 = 0.0
    k0 = 0
    k1 = 0
    for i in range(e.size):
        ev = e[i]
        av = decode16(a[i], shift, scale, special) if dec16 else np.float64(a[i])
        diff = av - ev
        fin = np.isfinite(diff)
        aref = abs(ev)
        mv = abs(m[i]) if has_m else aref
        if wkind == W_DIFF:
            w = 1.0
        elif wkind == W_EXP_REF:
            w = math.exp(ev)
        elif wkind == W_REF_CENTRED:
            w = ev - mean
        else:
            w = ev
        # where the pair and the shape's scale are finite: d = a - e and s the scale; else
        # the output is replaced by the reference: d = e - e (0, or NaN for a non-finite
        # reference, whose element is left out) and s = 1
        ref_fin = np.isfinite(ev)
        alt_num = (w * 0.0) if ref_fin else 0.0
        alt_den = (w * w) if ref_fin else 0.0
        v = _scale(aref, mv, coef_plain)
        ok0 = fin & np.isfinite(v)
        ws = w * v
        num0 += (w * diff) if ok0 else alt_num
        den0 += (ws * ws) if ok0 else alt_den
        v = _scale(aref, mv, coef_mid)
        ok1 = fin & np.isfinite(v)
        ws = w * v
        num1 += (w * diff) if ok1 else alt_num
        den1 += (ws * ws) if ok1 else alt_den
        z = count_zero & (ev == 0.0) & (diff != 0.0)  # a zero reference, an output that is not zero
        k0 += z & ok0
        k1 += z & ok1
    return num0, den0, num1, den1, k0, k1


@numba.njit(cache=True, nogil=True, inline="always")
def _ratio(num: float, den: float) -> float:  # pragma: no cover - numba
    """``numpy.where(num == 0, 0, num / den)`` of one row."""
    if num == 0.0:
        return 0.0
    if den == 0.0:
        return np.inf if num == num else np.nan
    return num / den
