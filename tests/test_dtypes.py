"""tolstat._base.dtypes: the one rounding to an output format and the unit roundoffs."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from tolstat._base.dtypes import round_to_format, target_dtype, unit_roundoff


def _nearest_even(x: float, grid: np.ndarray) -> float:
    """The value of a sorted grid of representable numbers nearest to x (ties: even bit pattern)."""
    i = int(np.searchsorted(grid, x))
    lo, hi = grid[max(i - 1, 0)], grid[min(i, grid.size - 1)]
    dlo, dhi = abs(Fraction(x) - Fraction(float(lo))), abs(Fraction(float(hi)) - Fraction(x))
    if dlo != dhi:
        return float(lo if dlo < dhi else hi)
    return float(lo if (np.array(lo, dtype=ml_dtypes.bfloat16).view(np.uint16) % 2 == 0) else hi)


def test_bfloat16_is_rounded_once_where_a_cast_through_float32_rounds_twice():
    grid = np.arange(0, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)  # 0 .. max finite
    # just above the half-way point between two bfloat16 numbers, below float32's resolution
    x = 1.0 + 2.0 ** -8 + 2.0 ** -30
    assert float(np.float64(x).astype(np.float32).astype(ml_dtypes.bfloat16)) == 1.0  # double rounding
    assert float(round_to_format(x, "bfloat16")) == _nearest_even(x, grid) == 1.0 + 2.0 ** -7
    rng = np.random.default_rng(3)
    xs = rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300)
    got = round_to_format(xs, "bfloat16").astype(np.float64)
    want = [np.sign(v) * _nearest_even(abs(v), grid) for v in xs]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["float16", "float32"])
def test_numpy_formats_equal_numpys_correctly_rounded_cast(name):
    rng = np.random.default_rng(1)
    xs = rng.standard_normal(1000) * 10.0 ** rng.integers(-10, 10, 1000)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(round_to_format(xs, name), xs.astype(target_dtype(name).np_dtype))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_overflow_is_infinite_or_clamped_as_asked(name):
    mx = target_dtype(name).max
    big = np.array([mx * 1.5, -mx * 1.5, np.inf, np.nan, mx])
    inf = round_to_format(big, name).astype(np.float64)
    clamp = round_to_format(big, name, overflow="clamp").astype(np.float64)
    np.testing.assert_array_equal(inf[:3], [np.inf, -np.inf, np.inf])
    np.testing.assert_array_equal(clamp[:3], [mx, -mx, np.inf])
    assert np.isnan(inf[3]) and np.isnan(clamp[3]) and inf[4] == clamp[4] == mx
    with pytest.raises(ValueError, match="overflow must be 'inf' or 'clamp', got 'wrap'"):
        round_to_format(big, name, overflow="wrap")


def test_a_format_without_infinities_overflows_to_nan():
    mx = target_dtype("float8_e4m3fn").max
    assert np.isnan(float(round_to_format(mx * 4, "float8_e4m3fn")))
    assert float(round_to_format(mx * 4, "float8_e4m3fn", overflow="clamp")) == mx


def test_gradual_underflow_keeps_subnormals_and_the_sign_of_zero():
    tiny = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    out = round_to_format(np.array([tiny, tiny * 0.4, -0.0, tiny * 1.6]), "bfloat16").astype(np.float64)
    assert out[0] == tiny and out[1] == 0.0 and np.signbit(out[2]) and out[3] == 2 * tiny


@pytest.mark.parametrize("name, p", [("float16", 11), ("bfloat16", 8), ("float32", 24), ("float64", 53)])
def test_unit_roundoff_is_half_the_machine_epsilon(name, p):
    assert unit_roundoff(name) == 2.0 ** -p == target_dtype(name).eps / 2


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_the_cast_is_used_only_where_it_rounds_once(name):
    """round_to_format takes ml_dtypes' cast where a probe of every value, midpoint and its
    neighbours finds it equal to the one rounding in float64, and a cast through float32
    (two roundings) fails the probe; either way the result is the one rounding."""
    from tolstat._base import dtypes

    td = target_dtype(name)
    assert dtypes._probe_cast(td, lambda x: x.astype(td.np_dtype)) == dtypes._cast_rounds_once(td)
    assert not dtypes._probe_cast(td, lambda x: x.astype(np.float32).astype(td.np_dtype))
    rng = np.random.default_rng(9)
    xs = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.uniform(-12, 12, 2000), [1.0 + 2.0 ** -8 + 2.0 ** -30]])
    with np.errstate(over="ignore", invalid="ignore"):
        want = dtypes._round_in_float64(xs, np.isfinite(xs), td, "inf").astype(np.float64)
        got = round_to_format(xs, name).astype(np.float64)
    np.testing.assert_array_equal(got, want)


def test_bfloat16_kernel_gives_the_one_roundings_bits_everywhere():
    """round_to_format's bfloat16 kernel (arrays of 256 values or more) against the rounding
    in float64 and ml_dtypes' cast, bit for bit: every bfloat16 value, every midpoint
    between neighbours and the float64 numbers next to it, both signs, the overflow edge,
    float64 subnormals, and NaN (the quiet NaN of its sign, as the cast gives)."""
    from tolstat._base import dtypes

    td = target_dtype("bfloat16")
    values = np.arange(0, 0x7F81, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)  # 0 .. inf
    mid = (values[:-2] + values[1:-1]) / 2
    edge = td.max + 2.0 ** 119  # the largest finite value plus half its ULP: a tie, to even, is inf
    over = np.array([td.max, edge, np.nextafter(edge, 0.0), np.nextafter(edge, np.inf), 1e300, 5e-324,
                     2.0 ** -1074 * 7, 2.0 ** -134, np.nextafter(2.0 ** -134, 1.0), 2.0 ** -133 * 1.5])
    xs = np.concatenate([values, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), over])
    xs = np.concatenate([xs, -xs])
    with np.errstate(over="ignore", invalid="ignore"):
        want = dtypes._round_in_float64(xs, np.isfinite(xs), td, "inf").view(np.uint16)
        got = round_to_format(xs, "bfloat16").view(np.uint16)
        np.testing.assert_array_equal(got, want)
        nans = np.array([np.nan, -np.nan] * 200)
        np.testing.assert_array_equal(round_to_format(nans, "bfloat16").view(np.uint16),
                                      nans.astype(ml_dtypes.bfloat16).view(np.uint16))
        shaped = xs[: 4 * 300].reshape(4, 300)
        assert round_to_format(shaped, "bfloat16").shape == (4, 300)
        if dtypes._cast_rounds_once(td):
            np.testing.assert_array_equal(got, xs.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_float16_store_and_widen_give_numpys_casts_bit_for_bit():
    """store_float16 and widen_float16 (numba kernels from 256 elements on) against numpy's
    casts: float32 patterns of every exponent, float64 values off the float32 grid, every
    midpoint between float16 neighbours and the numbers next to it, the overflow edge,
    subnormals, signed zeros, infinities; an array with a NaN takes numpy's cast (its
    payload); widening: every float16 pattern, NaN payloads included."""
    from tolstat._base.dtypes import store_float16, widen_float16

    rng = np.random.default_rng(21)
    patterns = np.arange(65536, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        grid = np.unique(patterns.astype(np.float64)[np.isfinite(patterns)])
    mid = (grid[:-1] + grid[1:]) / 2
    edges = np.array([65504.0, 65520.0, np.nextafter(65520.0, 0), 65519.99, 2.0 ** -24, 2.0 ** -25,
                      np.nextafter(2.0 ** -25, 1.0), 3 * 2.0 ** -26, 0.0, -0.0, np.inf, -np.inf, 1e300, 5e-324])
    x32 = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x32 = x32[~np.isnan(x32)]
    f32s = np.concatenate([x32, mid.astype(np.float32), np.nextafter(mid.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(mid.astype(np.float32), np.float32(-np.inf)), edges.astype(np.float32)])
    f64s = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), edges,
                           x32.astype(np.float64) * (1 + 2.0 ** -40)])
    with np.errstate(over="ignore", invalid="ignore"):
        for xs in (f32s, -f32s, f64s, -f64s, f64s.reshape(-1, 2)[: 1000]):
            np.testing.assert_array_equal(store_float16(xs).view(np.uint16), xs.astype(np.float16).view(np.uint16))
        with_nan = f32s[:1000].copy()
        with_nan[7] = np.float32(np.nan)
        with_nan[9] = -np.abs(np.float32(np.nan))
        np.testing.assert_array_equal(store_float16(with_nan).view(np.uint16),
                                      with_nan.astype(np.float16).view(np.uint16))
        assert round_to_format(f64s, "float16").view(np.uint16).tolist() == f64s.astype(np.float16).view(np.uint16).tolist()
        for dt in (np.float32, np.float64):
            got = widen_float16(patterns, dt)
            np.testing.assert_array_equal(got.view(np.uint32 if dt == np.float32 else np.uint64),
                                          patterns.astype(dt).view(np.uint32 if dt == np.float32 else np.uint64))
            assert widen_float16(patterns.reshape(256, 256), dt).shape == (256, 256)


def test_the_format_table_lists_every_format_and_makes_each_once():
    from tolstat._base.dtypes import SUPPORTED_DTYPES

    assert list(SUPPORTED_DTYPES) == ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"]
    assert len(SUPPORTED_DTYPES) == 6 and "bfloat16" in SUPPORTED_DTYPES and "float13" not in SUPPORTED_DTYPES
    assert SUPPORTED_DTYPES["bfloat16"] is SUPPORTED_DTYPES["bfloat16"]
    assert SUPPORTED_DTYPES["bfloat16"].np_dtype == np.dtype(ml_dtypes.bfloat16)
    assert SUPPORTED_DTYPES["float8_e4m3fn"].has_inf is False and SUPPORTED_DTYPES["float8_e5m2"].bits == 8
    with pytest.raises(KeyError):
        SUPPORTED_DTYPES["float13"]


def test_checking_float16_outputs_does_not_import_ml_dtypes():
    # importing ml_dtypes costs about half a second of CPU: a float16 suite does not pay it
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, tolstat\n"
        "rng = np.random.default_rng(0)\n"
        "pairs = [(e.astype(np.float16), e) for e in (rng.standard_normal(256) for _ in range(120))]\n"
        "ds = tolstat.from_pairs(pairs, op='sum', dtype='float16', hardware='cpu',\n"
        "                        options=tolstat.CollectOptions(progress=False))\n"
        "t = tolstat.select(ds, fp_budget=0.05)\n"
        "assert tolstat.check(pairs[0][0], pairs[0][1], op='sum', dtype='fp16', table=t, hardware='cpu').passed\n"
        "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'\n"
        "tolstat.ops.op_statistics('softmax', (np.ones((2, 8), np.float16),), {'dim': -1}, dtype='bfloat16')\n"
        "assert 'ml_dtypes' in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
