"""numba kernels of magnitudes of :mod:`tolstat.ops`: gelu's from the call's reference
(:attr:`tolstat.ops.model.OpModel.from_reference`) and layer_norm's from its input, each in
one pass without the temporaries of the numpy expression. Kept apart from the models so
that importing :mod:`tolstat.ops` does not import numba; gelu's is called from
``tolstat.ops._pointwise.KERNEL_FROM`` elements on, layer_norm's for every numpy input, each
input read as ``tolstat.ops._pointwise.kernel_input`` gives it."""

from __future__ import annotations

import math

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache
from tolstat._base.cast_kernels import decode16

__all__ = ["gelu_magnitude", "layer_norm_magnitude"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

@numba.njit(cache=True, nogil=True, error_model="numpy")
def gelu_magnitude(x: np.ndarray, d16: tuple, ref: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - numba
    """``out = ref - min(x, 0)`` (``gelu(|x|)`` from ``ref = gelu(x)``) over flat ``x`` and
    float64 ``ref``; False if an element of ``out`` is NaN. ``x`` is float32 or float64, or
    with ``d16 = (True, shift, scale, special)`` the bit patterns of a 16-bit float input,
    decoded exactly by :func:`tolstat._base.cast_kernels.decode16` (no table: its loads
    would miss the cache and keep the loop from vectorising)."""
    dec16, shift, scale, special = d16
    ok = True
    for i in range(out.size):
        v = decode16(x[i], shift, scale, special) if dec16 else np.float64(x[i])
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
def layer_norm_magnitude(x: np.ndarray, d16: tuple, rowlen: int, w: np.ndarray, b: np.ndarray, has_w: bool,
                         has_b: bool, eps: float, out: np.ndarray) -> None:  # pragma: no cover - numba
    """layer_norm's magnitude over the rows (``rowlen`` consecutive elements) of a flat ``x``
    (float32, float64 or 16-bit patterns with ``d16``, as :func:`gelu_magnitude`), each row
    read into a float64 buffer first, into ``out``."""
    dec16, shift, scale, special = d16
    buf = np.empty(rowlen)
    for r0 in range(0, x.size, rowlen):
        row = x[r0:r0 + rowlen]
        for i in range(rowlen):
            buf[i] = decode16(row[i], shift, scale, special) if dec16 else np.float64(row[i])
        _ln_row(buf, w, b, has_w, has_b, eps, out[r0:r0 + rowlen])
