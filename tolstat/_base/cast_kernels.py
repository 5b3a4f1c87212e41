"""numba kernel of :func:`tolstat._base.dtypes.round_to_format` for bfloat16: float64 values
rounded once (to nearest even, with gradual underflow) on their bit patterns.

ml_dtypes casts float64 to bfloat16 correctly from version 0.7 on, at about 9 ns per
element; this kernel gives the same bits (tested against the float64 ``frexp``/``rint``
definition of :func:`tolstat._base.dtypes._round_in_float64`) about ten times faster, which
matters where the embedded corpus stores every simulated output. Kept out of
:mod:`tolstat._base.dtypes` so that importing the dtype table does not import numba.
"""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["round_bfloat16_bits"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def round_bfloat16_bits(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """``out[i]``: the bfloat16 bit pattern (uint16) of float64 ``x[i]`` rounded once to
    nearest even, with gradual underflow; a value past the largest finite one plus half an
    ULP becomes +-inf, a NaN the quiet NaN of its sign.

    The magnitude is the value's index on bfloat16's integer line: its 53-bit significand
    shifted right to 8 bits (more for a bfloat16 subnormal), rounded on the bits shifted
    out, plus the exponent's offset; a carry out of the significand moves to the next
    binade, and one out of the largest binade gives the infinity's pattern.
    """
    p = 8  # bfloat16 precision (7 stored bits)
    emin_t = -126  # unbiased exponent of the smallest normal
    inf_bits = np.int64(0x7F80)
    xb = x.view(np.int64)
    for i in range(x.size):
        b = xb[i]
        sign = np.int64(0x8000) if b < 0 else np.int64(0)
        mag = b & np.int64(0x7FFFFFFFFFFFFFFF)
        e_field = mag >> 52
        if e_field == 0x7FF:
            if mag & np.int64(0xFFFFFFFFFFFFF):  # NaN
                out[i] = np.uint16(sign | np.int64(0x7FC0))
            else:
                out[i] = np.uint16(sign | inf_bits)
            continue
        if e_field == 0:  # zero or a float64 subnormal: far below half bfloat16's smallest step
            out[i] = np.uint16(sign)
            continue
        ue = e_field - 1023
        m53 = (mag & np.int64(0xFFFFFFFFFFFFF)) | (np.int64(1) << 52)
        shift = 52 - (p - 1) + (emin_t - ue if ue < emin_t else 0)
        if shift > 54:
            me = np.int64(0)
        else:
            q = m53 >> shift
            rem = m53 & ((np.int64(1) << shift) - 1)
            half = np.int64(1) << (shift - 1)
            if rem > half or (rem == half and (q & 1) == 1):
                q += 1
            me = q + ((ue - emin_t) << (p - 1) if ue >= emin_t else 0)
        if me >= inf_bits:  # overflow
            out[i] = np.uint16(sign | inf_bits)
        else:
            out[i] = np.uint16(sign | me)
