"""numba kernels of the casts tolstat makes most: float64 or float32 values rounded once to
a 16-bit format (to nearest even, with gradual underflow), and float16 widened (through a
table of numpy's own cast of every pattern).

ml_dtypes casts float64 to bfloat16 correctly from version 0.7 on, at about 9 ns per
element, and numpy's float16 casts take 2 to 2.5 ns per element; these kernels give the same
bits (tested against numpy's and ml_dtypes' casts and the float64 ``frexp``/``rint``
definition of :func:`tolstat._base.dtypes._round_in_float64`) several times faster, which
matters where the embedded corpus stores and loads every simulated value. A NaN is left to
the caller (numpy keeps part of a NaN's payload, which these kernels do not copy): the
kernels count them. Kept out of :mod:`tolstat._base.dtypes` so that importing the dtype
table does not import numba.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from tolstat._base import numba_cache as _numba_cache

__all__ = ["decode16", "float_bits", "float_from_bits", "round_bfloat16_bits", "round_float16_bits",
           "widen_float16", "float16_table"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@intrinsic
def float_bits(typingctx, x):  # noqa: ANN001, ANN202 - a numba intrinsic
    """The bit pattern of a float64 as an int64 (a register bitcast), in numba code."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def float_from_bits(typingctx, b):  # noqa: ANN001, ANN202 - a numba intrinsic
    """The float64 of an int64 bit pattern (a register bitcast), in numba code."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen



#: the exponent bits of a float64
_EXP_ALL64 = np.int64(0x7FF) << 52


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def decode16(h: int, shift: int, scale: float, special: int) -> float:  # pragma: no cover - numba
    """The float64 value of the bit pattern ``h`` of a 16-bit float format (float16:
    ``shift = 42``, ``scale = 2**1008``, ``special = 0x7c00``; bfloat16: ``45``, ``2**896``,
    ``0x7f80``), exact, without a table (a loop of it vectorises; for float16 the same bits
    as numpy's cast of every pattern, NaNs included).

    The exponent and significand bits, moved to the top of a float64's, make the float64
    ``2**(e - 1023) * 1.f`` (a subnormal float64 for ``e = 0``); times ``scale`` (the bias
    difference, a power of two: exact) that is the format's value, gradual underflow
    included. The patterns from ``special`` up (all exponent bits set) are an infinity or
    a NaN: the float64 exponent is set to all ones (significand 0: infinity). The sign bit
    is set last (``-0`` stays ``-0``).
    """
    x = np.int64(h)
    mag = x & 0x7FFF
    top = mag << shift
    v = float_from_bits(top) * scale
    r = float_from_bits(top | _EXP_ALL64) if mag >= special else v
    return float_from_bits(float_bits(r) | ((x & 0x8000) << 48))


@numba.njit(cache=True, nogil=True, inline="always")
def _round16(v: float, p: int, emin_t: int, inf_bits: int) -> int:  # pragma: no cover - numba
    """The 16-bit pattern of float64 ``v`` rounded once to nearest even in a format of
    precision ``p`` (stored bits ``p - 1``), smallest normal exponent ``emin_t`` and
    infinity pattern ``inf_bits``; -1 for a NaN (the caller's to handle).

    The magnitude is the value's index on the format's integer line: its 53-bit
    significand shifted right to ``p`` bits (more for a subnormal of the format), rounded on
    the bits shifted out, plus the exponent's offset; a carry out of the significand moves
    to the next binade, and one out of the largest binade gives the infinity's pattern,
    as does a larger value."""
    b = float_bits(v)
    sign = np.int64(0x8000) if b < 0 else np.int64(0)
    mag = b & np.int64(0x7FFFFFFFFFFFFFFF)
    e_field = mag >> 52
    if e_field == 0x7FF:
        if mag & np.int64(0xFFFFFFFFFFFFF):
            return -1
        return sign | inf_bits
    if e_field == 0:  # zero or a float64 subnormal: far below half the format's smallest step
        return sign
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
    return sign | (inf_bits if me >= inf_bits else me)


@numba.njit(cache=True, nogil=True)
def round_bfloat16_bits(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """``out[i]``: the bfloat16 bit pattern (uint16) of float64 ``x[i]`` rounded once to
    nearest even, with gradual underflow; a value past the largest finite one plus half an
    ULP becomes +-inf, a NaN the quiet NaN of its sign (as ml_dtypes' cast gives)."""
    for i in range(x.size):
        r = _round16(x[i], 8, -126, 0x7F80)
        if r < 0:
            r = (np.int64(0x8000) if float_bits(x[i]) < 0 else np.int64(0)) | np.int64(0x7FC0)
        out[i] = np.uint16(r)


@numba.njit(cache=True, nogil=True)
def round_float16_bits(x: np.ndarray, out: np.ndarray) -> int:  # pragma: no cover - numba
    """``out[i]``: the float16 bit pattern (uint16) of ``x[i]`` (float32 or float64) rounded
    once to nearest even, with gradual underflow, overflow to +-inf; returns the number of
    NaNs, whose patterns are left unset (numpy's cast keeps part of their payload)."""
    n_nan = 0
    for i in range(x.size):
        r = _round16(np.float64(x[i]), 11, -14, 0x7C00)
        if r < 0:
            n_nan += 1
            r = 0
        out[i] = np.uint16(r)
    return n_nan


@numba.njit(cache=True, nogil=True)
def widen_float16(h: np.ndarray, lut: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """``out[i] = lut[h[i]]``: float16 bit patterns (uint16) widened through the table of
    numpy's own cast of every pattern (:func:`float16_table`, so the same values, NaN
    payloads included), without numpy's per-element conversion."""
    for i in range(h.size):
        out[i] = lut[h[i]]


_TABLES: dict[str, np.ndarray] = {}


def float16_table(dtype: str) -> np.ndarray:
    """numpy's cast of every float16 bit pattern to ``dtype`` ("float32" or "float64"),
    made once (read only)."""
    t = _TABLES.get(dtype)
    if t is None:
        with np.errstate(invalid="ignore"):
            t = np.arange(65536, dtype=np.uint16).view(np.float16).astype(dtype)
        t.flags.writeable = False
        t = _TABLES[dtype] = t
    return t
