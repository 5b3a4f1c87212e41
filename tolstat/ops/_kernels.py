"""numba kernels of magnitudes of :mod:`tolstat.ops`: gelu's from the call's reference
(:attr:`tolstat.ops.model.OpModel.from_reference`) and layer_norm's from its input, each in
one pass without the temporaries of the numpy expression. Kept apart from the models so
that importing :mod:`tolstat.ops` does not import numba; the models call them from
``tolstat.ops._pointwise.KERNEL_FROM`` elements on."""

from __future__ import annotations

import math

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache
from tolstat._base.cast_kernels import decode16

__all__ = ["gelu_magnitude", "gelu_magnitude16", "layer_norm_magnitude", "layer_norm_magnitude16"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

@numba.njit(cache=True, nogil=True, error_model="numpy")
def gelu_magnitude(x: np.ndarray, ref: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - numba
    """``out = ref - min(x, 0)`` (``gelu(|x|)`` from ``ref = gelu(x)``) over flat float32 or
    float64 ``x`` and float64 ``ref``; False if an element of ``out`` is NaN."""
    ok = True
    for i in range(out.size):
        v = x[i]
        m = ref[i] - (v if v < 0.0 else 0.0)
        out[i] = m
        if m != m:
            ok = False
    return ok


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gelu_magnitude16(bits: np.ndarray, ref: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - numba
    """:func:`gelu_magnitude` of a float16 ``x`` given as its bit patterns (``uint16``),
    decoded exactly by :func:`tolstat._base.cast_kernels.decode16` (no table: its loads would
    miss the cache and keep the loop from vectorising)."""
    ok = True
    for i in range(out.size):
        v = decode16(bits[i], 42, 2.0 ** 1008, 0x7C00)
        m = ref[i] - (v if v < 0.0 else 0.0)
        out[i] = m
        if m != m:
            ok = False
    return ok


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _ln_row(x: np.ndarray, w: np.ndarray, b: np.ndarray, has_w: bool, has_b: bool, eps: float,
            out: np.ndarray) -> None:  # pragma: no cover - numba
    """layer_norm's magnitude of one row (``tolstat.ops._reductions._ln_rows``): its
    operations in its order, the three row means by sums that may be reassociated (the
    loops vectorise; numpy's sums are pairwise), ``w`` and ``b`` already absolute."""
    n = x.size
    s = 0.0
    for i in range(n):
        s += x[i]
    mu = s / n
    q = 0.0
    sa = 0.0
    for i in range(n):
        d = x[i] - mu
        q += d * d
        sa += abs(x[i])
    den = math.sqrt(q / n + eps)
    mabs = sa / n
    for i in range(n):
        v = (abs(x[i] - mu) + mabs) / den
        if has_w:
            v = v * w[i]
        if has_b:
            v = v + b[i]
        out[i] = v


@numba.njit(cache=True, nogil=True, error_model="numpy")
def layer_norm_magnitude(x: np.ndarray, rowlen: int, w: np.ndarray, b: np.ndarray, has_w: bool, has_b: bool,
                         eps: float, out: np.ndarray) -> None:  # pragma: no cover - numba
    """layer_norm's magnitude over the rows (``rowlen`` consecutive elements) of a flat
    float32 or float64 ``x``, into ``out``."""
    for r0 in range(0, x.size, rowlen):
        _ln_row(x[r0:r0 + rowlen], w, b, has_w, has_b, eps, out[r0:r0 + rowlen])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def layer_norm_magnitude16(bits: np.ndarray, rowlen: int, w: np.ndarray, b: np.ndarray,
                           has_w: bool, has_b: bool, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    """:func:`layer_norm_magnitude` of a float16 ``x`` given as its bit patterns (each row
    decoded exactly into a buffer first, by :func:`tolstat._base.cast_kernels.decode16`)."""
    buf = np.empty(rowlen)
    for r0 in range(0, bits.size, rowlen):
        row = bits[r0:r0 + rowlen]
        for i in range(rowlen):
            buf[i] = decode16(row[i], 42, 2.0 ** 1008, 0x7C00)
        _ln_row(buf, w, b, has_w, has_b, eps, out[r0:r0 + rowlen])
