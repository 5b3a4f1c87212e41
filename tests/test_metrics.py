"""Element-wise error metrics: ULP parity with numpy / brute force, bad inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing._private.utils import nulp_diff

import tolstat
from tolstat import error_metrics
from tolstat.measure import ulp_distance
from tolstat.measure.metrics import as_array
from tolstat._base.dtypes import target_dtype

NP_FLOATS = [np.float16, np.float32, np.float64]
ML_FLOATS = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]


def _edge_values(dt) -> np.ndarray:
    fi = np.finfo(dt)
    sub = fi.smallest_subnormal
    vals = [0.0, -0.0, sub, -sub, 2 * sub, fi.tiny, -fi.tiny, fi.max, -fi.max,
            1.0, -1.0, fi.eps, fi.max / 2]
    return np.array(vals, dtype=dt)


def _no_overflow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pairs where numpy's nulp_diff does not overflow its signed integer difference."""
    bits = {2: 15, 4: 31, 8: 63}[x.dtype.itemsize]
    ix = tolstat.measure.metrics.ordered_int(x, x.dtype).astype(float)
    iy = tolstat.measure.metrics.ordered_int(y, y.dtype).astype(float)
    return np.abs(ix - iy) < 2.0 ** bits - 1


@pytest.mark.parametrize("dt", NP_FLOATS)
def test_ulp_matches_numpy_nulp_random(dt):
    rng = np.random.default_rng(1)
    n = 5000
    # mixture of magnitudes and signs, including close pairs
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4, n)).astype(dt)
    close = x.astype(np.float64) * (1 + rng.integers(-40, 40, n) * np.finfo(dt).eps)
    y = np.where(rng.random(n) < 0.5, close, rng.standard_normal(n) * 3).astype(dt)
    keep = _no_overflow(x, y) & np.isfinite(x) & np.isfinite(y)
    ours = ulp_distance(x[keep], y[keep], dt)
    ref = nulp_diff(x[keep], y[keep]).ravel()
    # numpy returns the exact integer difference rounded to the float type itself
    np.testing.assert_array_equal(ours.astype(dt), ref)
    small = ours < 2.0 ** (np.finfo(dt).nmant + 1)
    assert small.sum() > 1000
    np.testing.assert_array_equal(ours[small], ref[small].astype(np.float64))


@pytest.mark.parametrize("dt", NP_FLOATS)
def test_ulp_matches_numpy_nulp_edges(dt):
    e = _edge_values(dt)
    x, y = np.meshgrid(e, e)
    x, y = x.ravel(), y.ravel()
    keep = _no_overflow(x, y)
    np.testing.assert_array_equal(
        ulp_distance(x[keep], y[keep], dt).astype(dt), nulp_diff(x[keep], y[keep]).ravel()
    )
    # +0 and -0 are the same point; smallest subnormal is one step from zero
    assert ulp_distance(np.array([0.0], dt), np.array([-0.0], dt), dt)[0] == 0
    sub = np.finfo(dt).smallest_subnormal
    assert ulp_distance(np.array([sub], dt), np.array([-sub], dt), dt)[0] == 2


def test_ulp_across_zero_is_exact_where_numpy_overflows():
    x = np.float32([3.0])
    y = np.float32([-3.0])
    i3 = int(np.float32(3.0).view(np.uint32))
    assert ulp_distance(x, y, "float32")[0] == 2 * i3  # numpy's int32 difference wraps here


def _all_finite_sorted(name: str) -> np.ndarray:
    td = target_dtype(name)
    allv = np.arange(2 ** td.bits, dtype=np.uint64).astype(td.uint_dtype).view(td.np_dtype)
    with np.errstate(invalid="ignore"):
        f = allv.astype(np.float64)
    f = np.unique(f[np.isfinite(f)])  # -0 and +0 collapse to one point
    return f


@pytest.mark.parametrize("name", ML_FLOATS)
def test_ulp_brute_force_rank(name):
    """ULP distance = difference of ranks among all finite values (the nextafter count)."""
    td = target_dtype(name)
    finite = _all_finite_sorted(name)
    rng = np.random.default_rng(2)
    ia = rng.integers(0, finite.size, 4000)
    ib = np.where(rng.random(4000) < 0.5, np.clip(ia + rng.integers(-5, 6, 4000), 0, finite.size - 1),
                  rng.integers(0, finite.size, 4000))
    a = finite[ia].astype(td.np_dtype)
    b = finite[ib].astype(td.np_dtype)
    np.testing.assert_array_equal(ulp_distance(a, b, name), np.abs(ia - ib).astype(float))
    # edge values: zeros, smallest subnormal, largest finite
    fi = ml_dtypes.finfo(td.np_dtype)
    edges = np.array([0.0, -0.0, float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
                      float(fi.max), -float(fi.max), float(fi.tiny)])
    rank = {v: i for i, v in enumerate(finite)}
    for u in edges:
        for v in edges:
            want = abs(rank[abs(u) * np.sign(u) + 0.0] - rank[abs(v) * np.sign(v) + 0.0])
            got = ulp_distance(np.array([u], td.np_dtype), np.array([v], td.np_dtype), name)[0]
            assert got == want, (u, v)


@pytest.mark.parametrize("name", ML_FLOATS + ["float16"])
def test_ulp_nextafter_walk(name):
    """Walk with np.nextafter and count: the literal brute-force definition."""
    td = target_dtype(name)
    rng = np.random.default_rng(3)
    for _ in range(20):
        start = np.array([rng.standard_normal() * 4], dtype=td.np_dtype)
        steps = int(rng.integers(0, 30))
        x = start.copy()
        up = np.array([np.inf if td.has_inf else float(ml_dtypes.finfo(td.np_dtype).max)], td.np_dtype)
        for _ in range(steps):
            nxt = np.nextafter(x, up)
            if nxt[0] == x[0] and np.signbit(x[0]):  # -0 -> +0 is no step
                nxt = np.nextafter(np.abs(nxt), up)
            x = nxt
        assert ulp_distance(x, start, name)[0] == steps


def test_ulp_nonfinite_semantics():
    inf, nan = np.inf, np.nan
    a = np.float16([inf, -inf, nan, inf, 1.0, nan])
    e = np.array([inf, inf, 1.0, 1.0, 1.0, nan])
    got = ulp_distance(a, e, "float16")
    np.testing.assert_array_equal(got, [0, inf, inf, inf, 0, 0])


def test_expected_rounded_to_target_and_overflow_is_infinite():
    # 2 + 2**-11 is below half an fp16 ulp at 2: rounds to 2.0 -> 0 ulp
    assert ulp_distance(np.float16([2.0]), np.array([2.0 + 2 ** -11]), "float16")[0] == 0
    # above fp16 max: the reference overflows, a saturated output is not 0 ulp
    assert ulp_distance(np.float16([65504.0]), np.array([70000.0]), "float16")[0] == np.inf
    # just below the rounding boundary (65520) the reference rounds to max: 0 ulp
    assert ulp_distance(np.float16([65504.0]), np.array([65519.0]), "float16")[0] == 0
    # float8_e4m3fn has no inf: overflow is still an infinite distance, never NaN or 0
    assert ulp_distance(np.array([448.0], ml_dtypes.float8_e4m3fn), np.array([1e4]), "float8_e4m3fn")[0] == np.inf
    # its tie at 464 rounds to even = 448 (the all-ones significand is NaN): no overflow
    assert ulp_distance(np.array([448.0], ml_dtypes.float8_e4m3fn), np.array([464.0]), "float8_e4m3fn")[0] == 0


@pytest.mark.parametrize("name", ML_FLOATS)
def test_expected_rounded_once_not_through_float32(name):
    """ml_dtypes double-rounds float64 -> bf16/fp8 via float32; tolstat must not."""
    td = target_dtype(name)
    finite = _all_finite_sorted(name)
    rng = np.random.default_rng(5)
    i = rng.integers(1, finite.size - 2, 3000)
    lo, hi = finite[i], finite[i + 1]
    mid = (lo + hi) / 2
    # a hair above / below the half-way point must round up / down
    above = mid + np.abs(mid) * 2.0 ** -40
    below = mid - np.abs(mid) * 2.0 ** -40
    hi_t = hi.astype(td.np_dtype)
    lo_t = lo.astype(td.np_dtype)
    assert (mid > 0).sum() > 500 and (mid < 0).sum() > 500
    np.testing.assert_array_equal(ulp_distance(hi_t, above, name), 0)
    np.testing.assert_array_equal(ulp_distance(lo_t, below, name), 0)
    # and through float32 (what ml_dtypes' cast does) it would be wrong at some point
    # of the test set for the 8-bit formats and bf16
    via32 = above.astype(np.float32).astype(td.np_dtype)
    assert (via32.astype(np.float64) != hi).any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=3, max_size=3))
def test_ulp_is_additive_along_the_line(vals):
    a, b, c = sorted(np.float32(v) for v in vals)
    d = lambda x, y: ulp_distance(np.float32([x]), np.float32([y]), "float32")[0]  # noqa: E731
    assert d(a, c) == d(a, b) + d(b, c)
    assert d(a, b) == d(b, a)


def test_error_metrics_values():
    a = np.float16([1.0, 2.0, -3.0])
    e = np.array([1.0, 2.001953125, -3.0004])
    m = error_metrics(a, e)
    assert m.dtype == "float16"
    np.testing.assert_allclose(m.abs, np.abs(a.astype(float) - e))
    np.testing.assert_allclose(m.signed, a.astype(float) - e)
    np.testing.assert_allclose(m.rel, np.abs(a.astype(float) - e) / np.abs(e))
    np.testing.assert_array_equal(m.ulp, [0, 1, 0])
    assert m.n_nonfinite == 0


def test_rel_floor_near_zero():
    m = error_metrics(np.float16([1e-3]), np.array([0.0]))
    assert m.rel_floor == pytest.approx(float(np.finfo(np.float16).tiny))
    assert m.rel[0] == pytest.approx(float(np.float16(1e-3)) / m.rel_floor)
    m2 = error_metrics(np.float16([1e-3]), np.array([0.0]), rel_floor=1.0)
    assert m2.rel[0] == pytest.approx(float(np.float16(1e-3)))


def test_nonfinite_actual_is_infinite_error_and_counted():
    m = error_metrics(np.float16([np.nan, np.inf, 1.0]), np.array([1.0, 1.0, 1.0]))
    assert m.n_nonfinite == 2
    assert np.isinf(m.abs[:2]).all() and np.isinf(m.ulp[:2]).all() and np.isinf(m.rel[:2]).all()


def test_nan_reference_is_an_error_unless_allowed():
    with pytest.raises(ValueError, match="NaN.*index \\(1,\\)"):
        error_metrics(np.float16([1.0, 1.0]), np.array([1.0, np.nan]))
    m = error_metrics(np.float16([1.0, np.nan, 2.0]), np.array([1.0, np.nan, np.nan]), allow_nan=True)
    assert m.abs[1] == 0 and np.isinf(m.abs[2]) and m.n_nonfinite == 1


@pytest.mark.parametrize(
    "actual, expected, kwargs, exc, pattern",
    [
        (np.zeros(3, np.float16), np.zeros(4), {}, ValueError, "shape mismatch"),
        (np.zeros(3, np.int32), np.zeros(3), {}, TypeError, "integer"),
        (np.zeros(3, bool), np.zeros(3), {}, TypeError, "integer/bool"),
        (np.zeros(3, np.complex64), np.zeros(3), {}, TypeError, "complex"),
        (np.zeros(3, np.float16), np.zeros(3, np.complex128), {}, TypeError, "complex"),
        (np.zeros(0, np.float16), np.zeros(0), {}, ValueError, "empty"),
        (np.zeros(3, np.float16), np.zeros(3), {"dtype": "float7"}, ValueError, "unknown target dtype"),
        (np.zeros(3, np.float16), np.zeros(3), {"rel_floor": -1.0}, ValueError, "rel_floor"),
    ],
)
def test_bad_inputs(actual, expected, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        error_metrics(actual, expected, **kwargs)


def test_dtype_spellings():
    for s in ("fp16", "half", np.float16, "FLOAT16"):
        assert tolstat._base.dtypes.canonical_dtype(s) == "float16"
    assert tolstat._base.dtypes.canonical_dtype(ml_dtypes.bfloat16) == "bfloat16"
    assert tolstat._base.dtypes.canonical_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="supported"):
        tolstat._base.dtypes.canonical_dtype("int8")


def test_array_protocols():
    class ArrayLike:
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    m = error_metrics(ArrayLike(np.float16([1.0])), [1.0], dtype="float16")
    assert m.abs[0] == 0


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    e = torch.tensor([1.0, 2.0, 3.01], dtype=torch.float64)
    m = error_metrics(a, e)
    assert m.dtype == "bfloat16"
    np.testing.assert_allclose(m.abs, [0, 0, 0.01], atol=1e-12)
    # 3.01 rounds to bf16 3.0 -> 0 ulp; 3.02 is past the half-way point 3.0078125? no: spacing 1/64
    assert m.ulp.tolist() == [0.0, 0.0, 1.0]


# --------------------------------------------------------------------------- conversions and ULP counts
# Conversion errors, ml_dtypes infinities, ULP counts of every format, array protocols.


RAGGED = [[1.0], [1.0, 2.0]]  # numpy cannot make an array of it


def test_conversion_errors_name_the_argument():
    with pytest.raises(TypeError, match="expected: cannot convert list to an array"):
        error_metrics(np.array([1.0]), RAGGED)
    with pytest.raises(TypeError, match="actual: cannot convert list to an array"):
        error_metrics(RAGGED, np.array([1.0]))
    with pytest.raises(TypeError, match="actual: cannot convert list to an array"):
        ulp_distance(RAGGED, np.array([1.0]), "float32")
    with pytest.raises(TypeError, match="expected: cannot convert list to an array"):
        ulp_distance(np.array([1.0]), RAGGED, "float32")
    with pytest.raises(TypeError, match="actual has integer/bool dtype"):
        error_metrics(np.array([1, 2]), np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="expected has integer/bool dtype"):
        error_metrics(np.array([1.0, 2.0]), np.array([1, 2]))
    with pytest.raises(TypeError, match="actual has integer/bool dtype"):
        ulp_distance(np.array([1, 2]), np.array([1.0, 2.0]), "float32")
    with pytest.raises(TypeError, match="expected has integer/bool dtype"):
        ulp_distance(np.array([1.0, 2.0]), np.array([1, 2]), "float32")


@pytest.mark.parametrize("dt", ["bfloat16", "float8_e5m2"])
def test_infinite_references_in_ml_dtypes_formats(dt):
    np_dt = getattr(ml_dtypes, dt)
    a = np.array([np.inf, -np.inf, 1.0, 1.25], dtype=np_dt)
    e = np.array([np.inf, -np.inf, 1.0, 1.0])
    d = ulp_distance(a, e, dt)
    assert d[:3].tolist() == [0.0, 0.0, 0.0] and d[3] > 0
    m = error_metrics(a, e, dtype=dt)
    assert m.ulp[:3].tolist() == [0.0, 0.0, 0.0] and m.n_nonfinite == 0


def test_as_array_default_name_in_its_error():
    with pytest.raises(TypeError, match="^array: cannot convert list to an array"):
        as_array([[1.0], [1.0, 2.0]])


def _ordered(v: np.ndarray, bits: int) -> np.ndarray:
    """Sign-magnitude bit patterns mapped to integers in value order (independent of tolstat)."""
    u = v.astype(np.int64)
    sign = 1 << (bits - 1)
    return np.where(u & sign, -(u & (sign - 1)), u)


@pytest.mark.parametrize("name, np_dt, uint, bits", [
    ("float16", np.float16, np.uint16, 16),
    ("bfloat16", ml_dtypes.bfloat16, np.uint16, 16),
    ("float32", np.float32, np.uint32, 32),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, np.uint8, 8),
])
def test_ulp_distance_counts_representable_values(name, np_dt, uint, bits):
    rng = np.random.default_rng(6)
    e64 = rng.standard_normal(400) * 4.0
    exp_rn = e64.astype(np_dt)
    steps = rng.integers(-3, 4, size=e64.size)
    a_bits = (_ordered(exp_rn.view(uint), bits) + steps)
    a_bits = np.where(a_bits < 0, (-a_bits) | (1 << (bits - 1)), a_bits).astype(uint)
    actual = a_bits.view(np_dt)
    finite = np.isfinite(actual.astype(np.float64))
    want = np.abs(_ordered(actual.view(uint), bits) - _ordered(exp_rn.view(uint), bits)).astype(np.float64)
    got = ulp_distance(actual, e64, name)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert finite.sum() > 300


def test_as_array_prefers_array_protocol_over_dlpack():
    """An object with both protocols is read through ``__array__`` (numpy's own conversion),
    so a DLPack export that numpy cannot import is never tried."""
    from tolstat.measure.metrics import as_array

    class Both:
        def __array__(self, dtype=None, copy=None):
            return np.array([1.0, 2.5], dtype=np.float32)

        def __dlpack__(self, *args, **kwargs):
            raise BufferError("not exportable")

        def __dlpack_device__(self):
            return (1, 0)

    got = as_array(Both(), name="actual")
    assert got.dtype == np.float32 and got.tolist() == [1.0, 2.5]
