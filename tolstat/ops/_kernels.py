"""numba kernels of the magnitudes that :mod:`tolstat.ops` computes from a call's reference
(:attr:`tolstat.ops.model.OpModel.from_reference`) in one pass, without the temporaries of
the numpy expression. Kept apart from the models so that importing :mod:`tolstat.ops` does
not import numba; the models call them from ``tolstat.ops._pointwise.KERNEL_FROM``
elements on."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["gelu_magnitude", "gelu_magnitude16"]

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
def gelu_magnitude16(bits: np.ndarray, table: np.ndarray, ref: np.ndarray,
                     out: np.ndarray) -> bool:  # pragma: no cover - numba
    """:func:`gelu_magnitude` of a float16 ``x`` given as its bit patterns (``uint16``) and
    the float64 value of every pattern (:func:`tolstat._base.cast_kernels.float16_table`)."""
    ok = True
    for i in range(out.size):
        v = table[bits[i]]
        m = ref[i] - (v if v < 0.0 else 0.0)
        out[i] = m
        if m != m:
            ok = False
    return ok
