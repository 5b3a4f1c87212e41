"""Read CPU DLPack tensors whose dtype numpy cannot import (bfloat16, float8).

``numpy.from_dlpack`` refuses DLPack's bfloat16 and float8 type codes ("Unsupported
dtype in DLTensor"). :func:`from_dlpack_lowp` reads such a tensor's ``DLManagedTensor``
through :mod:`ctypes` and copies its elements into a numpy array of the matching
``ml_dtypes`` type. Only CPU tensors are read; the producer's deleter is called once the
copy is made, as the DLPack protocol asks of a consumer.

The layout follows ``dlpack.h`` (DLPack 0.8 and later, unversioned ``"dltensor"``
capsule), type codes from DLPack 1.1.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["from_dlpack_lowp"]

_CPU = 1
#: (type code, bits) -> the ml_dtypes type's name (imported where one is read)
_CODES: dict[tuple[int, int], str] = {
    (4, 16): "bfloat16",  # kDLBfloat
    (10, 8): "float8_e4m3fn",  # kDLFloat8_e4m3fn
    (12, 8): "float8_e5m2",  # kDLFloat8_e5m2
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def from_dlpack_lowp(x: Any, *, name: str = "array") -> np.ndarray:
    """Copy a CPU bfloat16/float8 DLPack tensor into a numpy array.

    Parameters
    ----------
    x : object
        Anything with ``__dlpack__`` (and ``__dlpack_device__``).
    name : str
        The argument's name, for error messages.

    Returns
    -------
    numpy.ndarray
        A C-contiguous copy with an ``ml_dtypes`` dtype.

    Raises
    ------
    TypeError
        If the tensor is not on the CPU, or its dtype is not bfloat16/float8.
    """
    if hasattr(x, "__dlpack_device__"):
        dev = tuple(x.__dlpack_device__())
        if int(dev[0]) != _CPU:
            raise TypeError(f"{name}: DLPack device {dev} is not the CPU; move the tensor to the "
                            "CPU first")
    capsule = x.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ of {type(x).__name__} did not return a 'dltensor' capsule")
    managed = _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
    _api.PyCapsule_SetName(capsule, b"used_dltensor")  # consumed: the producer must not free it
    try:
        t = managed.dl_tensor
        key = (int(t.dtype.code), int(t.dtype.bits))
        if key not in _CODES or int(t.dtype.lanes) != 1:
            raise TypeError(f"{name}: DLPack dtype (code={key[0]}, bits={key[1]}, "
                            f"lanes={int(t.dtype.lanes)}) is not bfloat16 or float8")
        if int(t.device.device_type) != _CPU:
            raise TypeError(f"{name}: DLPack device type {int(t.device.device_type)} is not the CPU")
        import ml_dtypes

        dtype = np.dtype(getattr(ml_dtypes, _CODES[key]))
        shape = tuple(int(t.shape[i]) for i in range(t.ndim))
        if bool(t.strides):
            strides = tuple(int(t.strides[i]) for i in range(t.ndim))
        else:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(t.ndim))
        if any(s < 0 for s in strides):
            raise TypeError(f"{name}: negative DLPack strides are not supported")
        uint = np.dtype(f"u{dtype.itemsize}")
        if 0 in shape:
            return np.empty(shape, dtype)
        span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        base = (ctypes.c_char * (span * dtype.itemsize)).from_address(
            int(t.data or 0) + int(t.byte_offset))
        flat = np.frombuffer(base, dtype=uint, count=span)
        view = np.lib.stride_tricks.as_strided(
            flat, shape=shape, strides=tuple(s * dtype.itemsize for s in strides))
        return np.ascontiguousarray(view).view(dtype)
    finally:
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))
