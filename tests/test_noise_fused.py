"""record_statistics' one-pass numba path equals the numpy definition (run_statistics)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolstat.measure import noise


def _numpy_record(actual, expected, **kw):
    out = noise.run_statistics(actual, expected, **kw)
    mid = noise.run_statistics(actual, expected, shape=noise.MID_SHAPE, **kw)
    out.update({k + noise.MID_SUFFIX: v for k, v in mid.items()})
    return out


def _assert_same(fast, ref):
    assert list(fast) == list(ref)
    for k, v in ref.items():
        f = fast[k]
        if math.isnan(v):
            assert math.isnan(f), k
        elif k.removesuffix(noise.MID_SUFFIX) in ("op_max", "op_frac"):
            assert f == v, k  # maxima and counts: exact
        else:
            assert f == pytest.approx(v, rel=1e-12, abs=1e-300), k


def _case(rng, shape, dtype=np.float16, wide=False):
    e = rng.standard_normal(shape) * (np.exp(rng.uniform(-5, 5, shape)) if wide else 1.0)
    a = e.astype(dtype)
    a = (a.astype(np.float64) + 3e-3 * rng.standard_normal(shape)).astype(dtype)
    return a, e


@pytest.mark.parametrize("shape,rowwise,row_axis", [((257,), False, -1), ((33, 40), True, -1),
                                                    ((5, 7, 9), True, 1), ((6, 50), True, 0),
                                                    ((64,), True, -1), ((), False, -1)])
@pytest.mark.parametrize("with_mag", [False, True])
def test_fused_equals_numpy(shape, rowwise, row_axis, with_mag):
    rng = np.random.default_rng(7)
    a, e = _case(rng, shape, wide=True)
    mag = np.abs(e) + np.abs(rng.standard_normal(shape)) if with_mag else None
    kw = dict(dtype="float16", magnitude=mag, K=37.0, rowwise=rowwise, row_axis=row_axis)
    fast = noise._record_fused(a, e, acc_dtype="float32", op=None, **kw)
    assert fast is not None
    _assert_same(fast, _numpy_record(a, e, **kw))
    assert noise.record_statistics(a, e, **kw) == fast


def test_broadcast_magnitude_and_ops_with_invariants():
    rng = np.random.default_rng(8)
    for op in ("softmax", "layer_norm", "rms_norm", "log_softmax"):
        a, e = _case(rng, (12, 30), dtype=np.float32)
        mag = np.abs(rng.standard_normal(30))  # broadcasts along rows
        kw = dict(dtype="float32", magnitude=mag, K=30.0, rowwise=True, op=op)
        fast = noise.record_statistics(a, e, **kw)
        assert any(k.startswith("inv_") for k in fast)
        _assert_same(fast, _numpy_record(a, e, **kw))


@pytest.mark.parametrize("kind", ["same_inf", "nan_both", "bad_nan", "bad_inf"])
def test_non_finite_pairs(kind):
    rng = np.random.default_rng(9)
    a, e = _case(rng, (4, 16))
    a = a.astype(np.float64)
    if kind == "same_inf":
        a[1, 3] = e[1, 3] = np.inf
    elif kind == "nan_both":
        a[2, 5] = e[2, 5] = np.nan
    elif kind == "bad_nan":
        a[0, 0] = np.nan
    else:
        a[3, 1] = -np.inf
    kw = dict(dtype="float16", K=4.0, rowwise=True)
    fast = noise.record_statistics(a, e, **kw)
    ref = _numpy_record(a, e, **kw)
    _assert_same(fast, ref)
    assert (kind.startswith("bad")) == math.isinf(fast["op_max"])


def test_bad_arguments_still_raise_the_numpy_errors():
    a = np.zeros((3, 4), np.float16)
    e = np.zeros((3, 4))
    with pytest.raises(ValueError, match="shape"):
        noise.record_statistics(a, np.zeros(5), dtype="float16")
    with pytest.raises(ValueError, match="K must be a finite number"):
        noise.record_statistics(a, e, dtype="float16", K=-1.0)
    with pytest.raises(ValueError, match="row_axis"):
        noise.record_statistics(a, e, dtype="float16", rowwise=True, row_axis=5)
    with pytest.raises(ValueError, match="does not broadcast"):
        noise.record_statistics(a, e, dtype="float16", magnitude=np.ones(7))
    assert noise._record_fused(np.zeros(0), np.zeros(0), dtype="float16", magnitude=None, K=1.0,
                               acc_dtype="float32", row_axis=-1, rowwise=False, op=None) is None


def test_invariant_scales_of_both_shapes_equal_noise_scale_bit_for_bit():
    """The invariants' scales (one numba pass for both noise shapes) are noise_scale's values
    with 1.0 where the pair or the scale is not finite, and the same finite mask: outputs
    with infinities, magnitudes full-size, broadcast per row, scalar, absent or with a NaN."""
    from tolstat.measure import noise as N

    rng = np.random.default_rng(5)
    for t in range(240):
        shape = [(37,), (5, 64), (3, 4, 9), (1, 1)][t % 4]
        e = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)
        with np.errstate(over="ignore"):
            a = (e + rng.standard_normal(shape) * 1e-3 * np.abs(e)).astype(np.float16)
        mag = None
        if t % 3 == 1:
            mag = np.abs(e) * rng.uniform(1, 5, shape)
        if t % 3 == 2:
            mag = np.abs(e)[..., :1] * 3 if len(shape) > 1 else np.float64(2.0)
        if t % 7 == 0:
            a = a.astype(np.float64)
            a.flat[0] = np.inf
        if t % 11 == 0 and mag is not None and np.ndim(mag) > 0:
            mag = np.array(mag, dtype=float)
            mag.flat[0] = np.nan
        K = float(rng.choice([1, 16, 4096]))
        got = N._invariant_scales(a, e, mag, dtype="bfloat16" if t % 2 else "float16", K=K, acc_dtype="float32")
        for j, sh in enumerate((N.PLAIN_SHAPE, N.MID_SHAPE)):
            s = N.noise_scale(e, dtype="bfloat16" if t % 2 else "float16", magnitude=mag, K=K, shape=sh)
            a64 = np.asarray(a, dtype=np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                fin = np.isfinite(a64 - e) & np.isfinite(s)
            np.testing.assert_array_equal(got[j][1].view(np.int64), np.where(fin, s, 1.0).view(np.int64))
            np.testing.assert_array_equal(got[j][2], fin)
            np.testing.assert_array_equal(got[j][0], a64)
