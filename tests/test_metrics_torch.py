"""Conversion of torch tensors (and of DLPack-only objects) to numpy (``metrics.as_array``):
exact values, dtypes and bits.

torch is imported at module level on purpose: mutation testing collects the selected tests
once in its fork server, so the import is paid once, not once per mutant.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tolstat.measure.metrics import as_array, error_metrics, ulp_distance  # noqa: E402


def _bf16_bits_reference(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns by round-to-nearest-even of the float32 bits (finite inputs)."""
    b = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def test_bfloat16_tensor_keeps_its_bits_and_dtype():
    vals = np.array([1.0, 1.0 + 2.0**-7, -3.5, 1e-30, 3.0e38, 0.1, -0.0], dtype=np.float64)
    t = torch.tensor(vals, dtype=torch.float64).to(torch.bfloat16)
    a = as_array(t)
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(a.view(np.uint16), _bf16_bits_reference(vals))
    # the values the bits encode, checked against closed forms of bfloat16 rounding
    assert float(a[1]) == 1.0078125 and float(a[5]) == 0.10009765625
    assert math.copysign(1.0, float(a[6])) == -1.0


def test_bfloat16_strided_and_grad_tensor():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    t = base.t()  # a non-contiguous view
    a = as_array(t)
    np.testing.assert_array_equal(a.astype(np.float64), np.arange(12, dtype=np.float64).reshape(3, 4).T)
    g = torch.tensor([0.5, 2.0], requires_grad=True)
    np.testing.assert_array_equal(as_array(g * 3), np.array([1.5, 6.0], dtype=np.float32))
    assert as_array(g * 3).dtype == np.float32


@pytest.mark.parametrize(
    ("tdtype", "mldtype", "vals"),
    [
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, [0.875, -448.0, 2.0**-9, 1.125]),
        ("float8_e5m2", ml_dtypes.float8_e5m2, [57344.0, -1.5, 2.0**-16, 0.75]),
    ],
)
def test_float8_tensor_kept_exact(tdtype, mldtype, vals):
    if getattr(torch, tdtype, None) is None:
        pytest.skip(f"this torch has no {tdtype}")
    t = torch.tensor(vals, dtype=torch.float32).to(getattr(torch, tdtype))
    a = as_array(t)
    assert a.dtype == np.dtype(mldtype)
    np.testing.assert_array_equal(a.astype(np.float64), np.array(vals))
    # bits: the same as ml_dtypes' own rounding of the (exactly representable) values
    np.testing.assert_array_equal(a.view(np.uint8), np.array(vals, dtype=mldtype).view(np.uint8))


@pytest.mark.parametrize("tdtype", ["float16", "float32", "float64"])
def test_plain_float_tensor(tdtype):
    t = torch.tensor([1.0, -2.25, 1.0 / 3.0], dtype=getattr(torch, tdtype))
    a = as_array(t)
    assert a.dtype == np.dtype(tdtype)
    np.testing.assert_array_equal(a, np.array([1.0, -2.25, 1.0 / 3.0]).astype(tdtype))


def test_ulp_distance_of_bfloat16_tensors():
    # 1.0 and the next three bfloat16 numbers above it: distances 0..3 ULP
    expected = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.bfloat16)
    actual = torch.tensor([1.0, 1.0078125, 1.015625, 1.0234375], dtype=torch.bfloat16)
    np.testing.assert_array_equal(ulp_distance(actual, expected, "bfloat16"), [0, 1, 2, 3])


def test_error_metrics_of_torch_tensors():
    a = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    e = torch.tensor([1.0, 2.0 + 2.0**-6, 4.0 - 2.0**-4], dtype=torch.float64)
    m = error_metrics(a, e, dtype="bfloat16")
    assert m.dtype == "bfloat16"
    np.testing.assert_array_equal(m.abs, [0.0, 2.0**-6, 2.0**-4])
    np.testing.assert_array_equal(m.signed, [0.0, -(2.0**-6), 2.0**-4])


def test_as_array_of_a_dlpack_only_bfloat16_object_keeps_its_bits():
    class DLPackOnly:  # exposes DLPack but no __array__ (and is not a torch object)
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    t = torch.tensor([1.0, 1.5, -2.0, 3.140625], dtype=torch.bfloat16)
    a = as_array(DLPackOnly(t), name="actual")
    assert str(a.dtype) == "bfloat16"
    np.testing.assert_array_equal(a.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))
