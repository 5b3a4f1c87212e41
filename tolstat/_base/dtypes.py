"""Target floating-point dtypes: canonical names, numpy types and their bit layout.

tolstat measures rounding error *in a target dtype*: the dtype the kernel stores its
output in. This module maps the many spellings of those dtypes (``"fp16"``,
``torch.bfloat16``, ``np.float32``, ``ml_dtypes.float8_e4m3fn``) to one canonical name and
knows, for each, the unsigned integer type of its bit pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["TargetDtype", "SUPPORTED_DTYPES", "target_dtype", "canonical_dtype", "finfo", "round_to_format",
           "unit_roundoff", "store_float16", "widen_float16"]


@dataclass(frozen=True)
class TargetDtype:
    """A floating-point format that kernel outputs are stored in.

    Attributes
    ----------
    name : str
        Canonical name (``"float16"``, ``"bfloat16"``, ...).
    np_dtype : numpy.dtype
        The numpy (or ml_dtypes) dtype.
    uint_dtype : numpy.dtype
        Unsigned integer type of the same width, for the bit pattern.
    bits : int
        Width in bits.
    has_inf : bool
        Whether the format can represent infinities (float8_e4m3fn cannot).
    """

    name: str
    np_dtype: np.dtype
    uint_dtype: np.dtype
    bits: int
    has_inf: bool

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(finfo(self.np_dtype).max)

    @property
    def tiny(self) -> float:
        """Smallest positive normal value."""
        return float(finfo(self.np_dtype).tiny)

    @property
    def eps(self) -> float:
        """Machine epsilon (spacing of 1.0)."""
        return float(finfo(self.np_dtype).eps)


def finfo(dt: Any) -> Any:
    """``numpy.finfo`` of a float dtype, ``ml_dtypes.finfo`` for bfloat16 and float8 (imported
    only then)."""
    try:
        return np.finfo(dt)
    except (TypeError, ValueError):
        import ml_dtypes

        return ml_dtypes.finfo(dt)



class _Formats(Mapping[str, TargetDtype]):
    """The supported formats by canonical name. The formats of ``ml_dtypes`` (bfloat16,
    float8) are made on first use: importing ``ml_dtypes`` costs about half a second of
    CPU (its extension's set-up), which a process that checks float16 or float32 outputs
    does not need to pay."""

    #: name -> (numpy type or the ml_dtypes attribute's name, bit-pattern type, bits, has_inf)
    _SPECS: dict[str, tuple[Any, Any, int, bool]] = {
        "float16": (np.float16, np.uint16, 16, True),
        "bfloat16": ("bfloat16", np.uint16, 16, True),
        "float32": (np.float32, np.uint32, 32, True),
        "float64": (np.float64, np.uint64, 64, True),
        "float8_e4m3fn": ("float8_e4m3fn", np.uint8, 8, False),
        "float8_e5m2": ("float8_e5m2", np.uint8, 8, True),
    }

    def __init__(self) -> None:
        self._made: dict[str, TargetDtype] = {}

    def __getitem__(self, name: str) -> TargetDtype:
        got = self._made.get(name)
        if got is None:
            kind, uint, bits, has_inf = self._SPECS[name]
            if isinstance(kind, str):
                import ml_dtypes

                kind = getattr(ml_dtypes, kind)
            got = self._made[name] = TargetDtype(name, np.dtype(kind), np.dtype(uint), bits, has_inf)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._SPECS)

    def __len__(self) -> int:
        return len(self._SPECS)

    def __contains__(self, name: object) -> bool:
        return name in self._SPECS


#: canonical name -> :class:`TargetDtype` (a read-only mapping; ``ml_dtypes`` formats made on first use)
SUPPORTED_DTYPES: Mapping[str, TargetDtype] = _Formats()

_ALIASES: dict[str, str] = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f2": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "single": "float32",
    "f4": "float32",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
    "f8": "float64",
    "float8_e4m3fn": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e4m3fn": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
}


def canonical_dtype(dtype: Any) -> str:
    """Return the canonical name of a target dtype.

    Parameters
    ----------
    dtype : str, numpy dtype, ml_dtypes type or torch dtype
        Any common spelling: ``"fp16"``, ``"bf16"``, ``np.float32``,
        ``ml_dtypes.float8_e5m2``, ``torch.bfloat16``.

    Returns
    -------
    str
        One of ``SUPPORTED_DTYPES``.

    Raises
    ------
    ValueError
        If the dtype is not a supported floating-point format.
    TypeError
        If ``dtype`` is not something that names a dtype.
    """
    if isinstance(dtype, TargetDtype):
        return dtype.name
    try:
        return _CANONICAL[dtype]  # a spelling seen before (hashable: str, numpy and torch dtypes)
    except (KeyError, TypeError):
        pass
    name = _canonical_uncached(dtype)
    if len(_CANONICAL) < 256:
        try:
            _CANONICAL[dtype] = name
        except TypeError:  # unhashable
            pass
    return name


#: spelling -> canonical name, filled by :func:`canonical_dtype` (a per-check lookup)
_CANONICAL: dict[Any, str] = {}


def _canonical_uncached(dtype: Any) -> str:
    """:func:`canonical_dtype` without the cache."""
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
    elif type(dtype).__module__.startswith("torch"):
        key = str(dtype).lower().removeprefix("torch.")
    else:
        try:
            key = np.dtype(dtype).name.lower()
        except TypeError as exc:
            raise TypeError(f"cannot interpret {dtype!r} as a dtype") from exc
    if key in _ALIASES:
        return _ALIASES[key]
    raise ValueError(
        f"unknown target dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}"
    )


def target_dtype(dtype: Any) -> TargetDtype:
    """Return the :class:`TargetDtype` for any spelling of a supported dtype."""
    return SUPPORTED_DTYPES[canonical_dtype(dtype)]


def round_to_format(x: Any, dtype: Any, *, overflow: str = "inf") -> np.ndarray:
    """Round values to a target dtype once: nearest even, gradual underflow.

    The one rounding of tolstat to an output format. numpy rounds float64 to
    float16/float32 correctly; ml_dtypes' casts to bfloat16 and float8 do so from version
    0.7 on, and went through float32 (rounding twice) before. Where the installed version's
    cast is not the one rounding (:func:`_cast_rounds_once`, decided once per format), the
    rounding is done in float64 with ``frexp``/``rint`` and the final cast is exact.

    Parameters
    ----------
    x : array_like
        Real values (any float dtype; NaN and infinities pass through).
    dtype : str or dtype
        A supported target dtype (:data:`SUPPORTED_DTYPES`).
    overflow : {"inf", "clamp"}
        ``"inf"``: what a kernel storing the value gets (IEEE: past the largest finite
        value plus half an ULP, +-inf; NaN in a format without infinities);
        ``"clamp"``: +-the largest finite value (the reference of a ULP distance).

    Returns
    -------
    numpy.ndarray
        Array of the target dtype.
    """
    if overflow not in ("inf", "clamp"):
        raise ValueError(f"overflow must be 'inf' or 'clamp', got {overflow!r}")
    td = target_dtype(dtype)
    x64 = np.asarray(x, dtype=np.float64)
    if overflow == "clamp":
        x64 = np.where(np.isfinite(x64), np.clip(x64, -td.max, td.max), x64)
    if td.name == "bfloat16" and x64.size >= _KERNEL_FROM:  # the same bits as the cast, about eight times faster
        from tolstat._base.cast_kernels import round_bfloat16_bits

        flat = np.ascontiguousarray(x64).ravel()
        out = np.empty(flat.size, dtype=np.uint16)
        round_bfloat16_bits(flat, out)
        return out.view(td.np_dtype).reshape(x64.shape)
    if td.name == "float16":
        return store_float16(x64)
    with np.errstate(over="ignore", invalid="ignore"):
        if td.name in ("float32", "float64") or _cast_rounds_once(td):
            return x64.astype(td.np_dtype)
        return _round_in_float64(x64, np.isfinite(x64), td, overflow)


#: from this many elements on, the casts to and from 16-bit formats take the numba kernels
#: of :mod:`tolstat._base.cast_kernels` (below it numpy's per-call cost is the smaller)
_KERNEL_FROM = 256


def store_float16(x: np.ndarray) -> np.ndarray:
    """``x.astype(numpy.float16)`` for a float32 or float64 array: the same bits (one
    rounding to nearest even, gradual underflow, overflow to infinity), by a numba kernel
    about three times faster from :data:`_KERNEL_FROM` elements on; an array with a NaN
    takes numpy's cast (which keeps part of the NaN's payload)."""
    if x.size >= _KERNEL_FROM and x.dtype in (np.float32, np.float64):
        from tolstat._base.cast_kernels import round_float16_bits

        flat = np.ascontiguousarray(x).ravel()
        out = np.empty(flat.size, dtype=np.uint16)
        if round_float16_bits(flat, out) == 0:
            return out.view(np.float16).reshape(x.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16)


def widen_float16(x: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """``x.astype(dtype)`` for a float16 array and ``dtype`` float32 or float64: the same
    values (numpy's own cast of every bit pattern, tabled once, NaN payloads included),
    by a numba table lookup about four times faster from :data:`_KERNEL_FROM` elements on."""
    name = np.dtype(dtype).name
    if x.dtype == np.float16 and x.size >= _KERNEL_FROM and name in ("float32", "float64"):
        from tolstat._base.cast_kernels import float16_table, widen_float16 as _widen

        flat = np.ascontiguousarray(x).ravel()
        out = np.empty(flat.size, dtype=name)
        _widen(flat.view(np.uint16), float16_table(name), out)
        return out.reshape(x.shape)
    return x.astype(dtype)


def _round_in_float64(x64: np.ndarray, finite: np.ndarray, td: TargetDtype, overflow: str) -> np.ndarray:
    """:func:`round_to_format` by ``frexp``/``rint`` in float64 (one rounding; the final cast is exact)."""
    with np.errstate(over="ignore", invalid="ignore"):
        fi = finfo(td.np_dtype)
        p = int(fi.nmant) + 1
        emin = int(np.log2(td.tiny)) + 1  # frexp exponent of the smallest normal
        _, ex = np.frexp(x64)
        ex = np.maximum(ex, emin)
        q = np.ldexp(np.rint(np.ldexp(x64, p - ex)), ex - p)
        q = np.where(finite, q, x64)
        if overflow == "inf":
            q = np.where(finite & (np.abs(q) > td.max), np.copysign(np.inf if td.has_inf else np.nan, x64), q)
        return q.astype(td.np_dtype)


_CAST_ONCE: dict[str, bool] = {}


def _cast_rounds_once(td: TargetDtype) -> bool:
    """Whether the installed ml_dtypes casts float64 to ``td`` with one rounding (0.7 does;
    earlier versions went through float32). Decided once per format by comparing the cast
    with :func:`_round_in_float64` on every value of the format, every midpoint between
    neighbours and the float64 numbers next to it (both signs), and values beyond the range."""
    got = _CAST_ONCE.get(td.name)
    if got is None:
        got = _CAST_ONCE[td.name] = _probe_cast(td, lambda x: x.astype(td.np_dtype))
    return got


def _probe_cast(td: TargetDtype, cast: Any) -> bool:
    """Whether ``cast`` (float64 array -> array of ``td``) rounds as :func:`_round_in_float64` (:func:`_cast_rounds_once`)."""
    codes = np.arange(2 ** td.bits, dtype=td.uint_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        v = codes.view(td.np_dtype).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mid = (v[:-1] + v[1:]) / 2
    x = np.concatenate([v, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf),
                        [td.max * 1.01, -td.max * 1.01, 1e300, -1e300, 5e-324, np.inf, -np.inf, np.nan]])
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.asarray(cast(x), dtype=td.np_dtype).view(td.uint_dtype)
        b = _round_in_float64(x, np.isfinite(x), td, "inf").view(td.uint_dtype)
        nan_a = np.isnan(a.view(td.np_dtype).astype(np.float64))
        nan_b = np.isnan(b.view(td.np_dtype).astype(np.float64))
    return bool(np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a], b[~nan_b]))


_PRECISION = {  # significand bits including the implicit one
    "float16": 11,
    "bfloat16": 8,
    "float32": 24,
    "float64": 53,
    "float8_e4m3fn": 4,
    "float8_e5m2": 3,
}


def unit_roundoff(dtype: Any) -> float:
    """Unit roundoff ``u = 2**-p`` of a floating-point format (half its machine epsilon).

    Parameters
    ----------
    dtype : str or dtype
        Any spelling :func:`tolstat._base.dtypes.canonical_dtype` accepts.

    Returns
    -------
    float
        ``2**-11`` (float16), ``2**-8`` (bfloat16), ``2**-24`` (float32), ``2**-53``
        (float64), ``2**-4`` (float8_e4m3fn), ``2**-3`` (float8_e5m2).

    Examples
    --------
    >>> unit_roundoff("fp16") == 2.0 ** -11
    True
    """
    return 2.0 ** -_PRECISION[canonical_dtype(dtype)]
