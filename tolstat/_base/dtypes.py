"""Target floating-point dtypes: canonical names, numpy types and their bit layout.

tolstat measures rounding error *in a target dtype*: the dtype the kernel stores its
output in. This module maps the many spellings of those dtypes (``"fp16"``,
``torch.bfloat16``, ``np.float32``, ``ml_dtypes.float8_e4m3fn``) to one canonical name and
knows, for each, the unsigned integer type of its bit pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["TargetDtype", "SUPPORTED_DTYPES", "target_dtype", "canonical_dtype"]


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
        return float(_finfo(self.np_dtype).max)

    @property
    def tiny(self) -> float:
        """Smallest positive normal value."""
        return float(_finfo(self.np_dtype).tiny)

    @property
    def eps(self) -> float:
        """Machine epsilon (spacing of 1.0)."""
        return float(_finfo(self.np_dtype).eps)


def _finfo(dt: np.dtype) -> Any:
    try:
        return np.finfo(dt)
    except (TypeError, ValueError):
        return ml_dtypes.finfo(dt)


SUPPORTED_DTYPES: dict[str, TargetDtype] = {
    "float16": TargetDtype("float16", np.dtype(np.float16), np.dtype(np.uint16), 16, True),
    "bfloat16": TargetDtype(
        "bfloat16", np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16), 16, True
    ),
    "float32": TargetDtype("float32", np.dtype(np.float32), np.dtype(np.uint32), 32, True),
    "float64": TargetDtype("float64", np.dtype(np.float64), np.dtype(np.uint64), 64, True),
    "float8_e4m3fn": TargetDtype(
        "float8_e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.uint8), 8, False
    ),
    "float8_e5m2": TargetDtype(
        "float8_e5m2", np.dtype(ml_dtypes.float8_e5m2), np.dtype(np.uint8), 8, True
    ),
}

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
