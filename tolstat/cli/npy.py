"""Load ``.npy``/``.npz`` kernel outputs, including bfloat16 and float8 ones.

ml_dtypes types have no ``.npy`` type code of their own: ``numpy.save`` writes a
bfloat16 array as raw 2-byte void (``'<V2'``), float8_e4m3fn as ``'<V1'`` and
float8_e5m2 as ``'<f1'``, which ``numpy.load`` cannot even parse. :func:`load_array`
reads such files and views their elements as the target dtype the caller names.
"""

from __future__ import annotations

import ast
import os
from typing import Any

import numpy as np

__all__ = ["load_array"]

#: descriptors numpy writes for ml_dtypes arrays but cannot read back
_UNREADABLE = {"<f1", "|f1", ">f1"}


def _read_raw_npy(path: str) -> tuple[np.ndarray, str]:
    """Read a .npy whose descriptor numpy rejects: its bytes as ``uint8`` items."""
    with open(path, "rb") as fh:
        major, _minor = np.lib.format.read_magic(fh)
        size = int.from_bytes(fh.read(2 if major == 1 else 4), "little")
        header = ast.literal_eval(fh.read(size).decode("latin1"))
        descr, shape, fortran = header["descr"], tuple(header["shape"]), header["fortran_order"]
        if not isinstance(descr, str) or descr not in _UNREADABLE:
            raise ValueError(f"{path}: unsupported .npy descriptor {descr!r}")
        n = int(np.prod(shape, dtype=np.int64))
        flat = np.frombuffer(fh.read(n), dtype=np.uint8, count=n)
    return flat.reshape(shape, order="F" if fortran else "C").view("V1"), descr


def load_array(path: str | os.PathLike[str], dtype: Any = None) -> np.ndarray:
    """Load a single array from ``.npy`` (or a one-array ``.npz``).

    Parameters
    ----------
    path : path-like
        The file.
    dtype : str or dtype, optional
        The target dtype (any spelling :func:`tolstat._base.dtypes.canonical_dtype` takes). Needed
        for files holding raw bytes (bfloat16, float8): their elements are viewed as it.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        If a ``.npz`` holds more than one array, or raw elements are found without
        ``dtype`` or with a ``dtype`` of another width.
    """
    path = os.fspath(path)
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if len(z.files) != 1:
                raise ValueError(f"{path}: expected one array in the .npz, found {z.files}")
            a = z[z.files[0]]
    else:
        try:
            a = np.load(path, allow_pickle=False)
        except ValueError as exc:
            if "descr is not a valid dtype descriptor" not in str(exc):
                raise
            a, _ = _read_raw_npy(path)
    if a.dtype.kind == "V" and a.dtype.fields is None:
        from tolstat._base.dtypes import target_dtype

        if dtype is None:
            raise ValueError(f"{path}: raw {a.dtype.itemsize}-byte elements (bfloat16 or float8 "
                             "saved by numpy); pass the target dtype")
        target = target_dtype(dtype).np_dtype
        if target.itemsize != a.dtype.itemsize:
            raise ValueError(f"{path}: {a.dtype.itemsize}-byte elements cannot be dtype "
                             f"{dtype!r} ({target.itemsize} bytes)")
        a = a.view(target)
    return a
