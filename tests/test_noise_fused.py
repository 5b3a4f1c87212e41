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


def _invariants_numpy(a, e, mag, op, row_axis, K=30.0, dtype="float16"):
    """Both shapes' invariants by their numpy definition (the scales, then invariant_values)."""
    from tolstat.measure.invariants import invariant_values, invariants

    scales = noise._invariant_scales(np.asarray(a, dtype=np.float64), e, mag, dtype=dtype, K=K, acc_dtype="float32")
    return tuple(invariant_values(a64, np.asarray(e, dtype=np.float64), s, fin, row_axis, invariants(op), op)
                 for a64, s, fin in scales)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape,row_axis", [((12, 30), -1), ((5, 7, 9), 1), ((6, 50), 0), ((64,), -1), ((), -1)])
@pytest.mark.parametrize("mag_kind", ["none", "full", "broadcast"])
@pytest.mark.parametrize("special", ["none", "matched_inf", "nan_both", "zero_ref", "zero_row", "mag_inf"])
def test_fused_invariants_equal_their_numpy_definition(op, shape, row_axis, mag_kind, special):
    _fused_against_numpy(op, shape, row_axis, mag_kind, special, "float64")


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
@pytest.mark.parametrize("shape,row_axis", [((12, 300), -1), ((5, 7, 9), 1)])
@pytest.mark.parametrize("special", ["none", "matched_inf", "nan_both", "zero_ref", "mag_inf"])
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16", "float32"])
def test_fused_invariants_read_low_precision_outputs_as_their_values(op, shape, row_axis, special, out_dtype):
    # float16 and bfloat16 outputs are decoded from their bits in the kernel
    _fused_against_numpy(op, shape, row_axis, "full", special, out_dtype)


def _fused_against_numpy(op, shape, row_axis, mag_kind, special, out_dtype):
    import ml_dtypes

    rng = np.random.default_rng([len(op), len(shape), len(mag_kind), len(special)])
    e = np.asarray(rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape)))
    a = np.asarray((e + 1e-3 * np.abs(e) * rng.standard_normal(shape)).astype(np.float16), dtype=np.float64)
    if e.size:
        ef, af = e.reshape(-1), a.reshape(-1)
        if special == "matched_inf":
            ef[0] = af[0] = np.inf
        elif special == "nan_both":
            ef[-1] = af[-1] = np.nan
        elif special == "zero_ref":  # masked positions: a zero reference, an output that is zero or not
            ef[::3] = 0.0
            af[::6] = 1e-3
            af[3::6] = 0.0
        elif special == "zero_row":
            a[...] = e
    mag = {"none": None, "full": np.abs(e) + np.abs(rng.standard_normal(shape)),
           "broadcast": np.abs(rng.standard_normal(shape[-1:])) if shape else None}[mag_kind]
    if special == "mag_inf" and mag is not None:  # a scale that is not finite where the pair is
        mag = np.array(mag, dtype=np.float64)
        mag.reshape(-1)[0] = np.inf
        if mag.shape == e.shape:  # there also a zero reference under a nonzero output (not masked: its scale is inf)
            e.reshape(-1)[0] = 0.0
            a.reshape(-1)[0] = 1e-3
    if out_dtype != "float64":
        a = a.astype(ml_dtypes.bfloat16 if out_dtype == "bfloat16" else out_dtype)
    from tolstat.measure.invariants import invariants

    try:
        want = _invariants_numpy(a, e, mag, op, row_axis)
    except ValueError as exc:  # a NaN statistic (exp of an infinite reference): the kernels report it too
        with pytest.raises(ValueError, match="must be >= 0"):
            noise._fused_invariants(a, e, mag, invariants(op), dtype="float16", K=30.0, acc_dtype="float32",
                                    row_axis=row_axis, op=op)
        assert "must be >= 0" in str(exc)
        return
    got = noise._fused_invariants(a, e, mag, invariants(op), dtype="float16", K=30.0, acc_dtype="float32",
                                  row_axis=row_axis, op=op)
    assert got is not None
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for k, v in w.items():
            if k == "inv_masked_zero" or math.isinf(v) or v == 0.0:
                assert g[k] == v, (k, g[k], v)  # counts, zeros and infinities: exact
            else:
                assert g[k] == pytest.approx(v, rel=1e-12), (k, g[k], v)


def test_fused_invariants_leave_a_registered_invariant_to_numpy():
    from tolstat.measure.invariants import invariants

    a = np.ones((2, 3))
    custom = {"mine": lambda a, e, s: 0.0}
    assert noise._fused_invariants(a, a, None, custom, dtype="float16", K=3.0, acc_dtype="float32", row_axis=-1,
                                   op="softmax") is None
    assert noise._fused_invariants(a, a, None, invariants("softmax"), dtype="float16", K=3.0, acc_dtype="float32",
                                   row_axis=-1, op="softmax") is not None


def test_fused_masked_zero_count_alone_equals_its_numpy_definition():
    from tolstat.measure import invariants as inv_mod

    op = "test_only_masked_zero_op"
    inv_mod.register_invariant(op, "masked_zero", inv_mod._inv_masked_zero, replace=True)
    try:
        rng = np.random.default_rng(5)
        e = rng.standard_normal((6, 40))
        e[:, ::4] = 0.0
        a = e + 1e-3 * rng.standard_normal(e.shape)
        a[0, 0] = 0.0  # a zero output under a zero reference is not counted
        mag = np.abs(e) + 1.0
        mag[1, 0] = np.inf  # nor one whose scale is not finite
        got = noise._fused_invariants(a, e, mag, inv_mod.invariants(op), dtype="float16", K=40.0,
                                      acc_dtype="float32", row_axis=-1, op=op)
        want = _invariants_numpy(a, e, mag, op, -1, K=40.0)
        assert got == want and 0 < got[0]["inv_masked_zero"] < np.count_nonzero(e == 0)
    finally:
        inv_mod._INVARIANTS.pop(op, None)
