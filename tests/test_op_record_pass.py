"""The record's pass (:func:`tolstat.measure.fused.op_statistics`) returns what its
reference kernel (:func:`tolstat.measure.fused._op_kernel`) returns, bit for bit.

``op_statistics`` runs a finite pair through the blocked kernel
(:func:`tolstat.measure.fused._op_blocked_kernel` with ``full``: every column, the sum of
``|z|`` and the count ``|z| > k`` included, the worst element, the counts and the first
bad and low magnitudes) and refers any other pair (a non-finite output, reference, scale
or ``0 / 0``) to ``_op_kernel``. Every field of the result, on either path, must be what
``_op_kernel`` alone gives.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolstat._base.dtypes import target_dtype
from tolstat.measure import fused
from tolstat.measure.fused import OpPass, op_statistics
from kernel_helpers import op_reference

DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
COEF = (2.0 ** -11, 2.0 ** -24 * 8.0, 2.0 ** -11 / 8.0, 2.0 ** -25)  # op_pass_coefficients of float16, K = 64


def _np(dtype):
    return target_dtype(dtype).np_dtype


def _kernel_pass(actual, expected, magnitude, *, coef, frac_k, rowlen, dtype, kq=np.inf):
    """:func:`op_statistics` as it was: :func:`fused._op_kernel` on every pair."""
    a = np.ravel(actual)
    e = np.ravel(expected)
    m = e if magnitude is None else np.ravel(magnitude)
    a, lut, use_lut = fused._kernel_output(a)
    rp, remin, rmax = fused.round_params(dtype)
    rl = int(rowlen) if rowlen else max(1, e.size)
    st, bad, info = fused._op_kernel(a, lut, use_lut, e, m, magnitude is not None, rp, remin, rmax, *map(float, coef),
                                     float(frac_k), rl, float(kq))
    return OpPass(st, bad, *(int(x) for x in info))


def _bits_equal(x, y):
    """Equal float64 arrays, bit for bit (NaN patterns and signed zeros included)."""
    x, y = np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64)
    return x.shape == y.shape and np.array_equal(x.view(np.int64), y.view(np.int64))


def _same(got, want):
    """Every field of two :class:`OpPass`, bit for bit; the first difference, or None."""
    if not _bits_equal(got.stats, want.stats):
        return ("stats", got.stats, want.stats)
    if got.bad.dtype != want.bad.dtype or not np.array_equal(got.bad, want.bad):
        return ("bad", got.bad, want.bad)
    for f in OpPass._fields[2:]:
        g, w = getattr(got, f), getattr(want, f)
        if type(g) is not int or g != w:
            return (f, g, w)
    return None


def _both(a, e, m, **kw):
    """``(op_statistics, the reference kernel's pass, took the blocked kernel)``."""
    got = op_statistics(a, e, m, **kw)
    want = _kernel_pass(a, e, m, **kw)
    x = np.ravel(a)
    out, lut, use_lut, dec16, shift, scale, special = fused._blocked_output(x)
    rp, remin, rmax = fused.round_params(kw["dtype"])
    qs = math.ldexp(1.0, remin - rp) if rp > 0 else 1.0
    ev = np.ravel(e)
    rl = int(kw["rowlen"]) if kw["rowlen"] else max(1, ev.size)
    _, info = fused._op_blocked_kernel(out, lut, use_lut, ev, ev if m is None else np.ravel(m), m is not None, rp,
                                       remin, rmax, 1.0 / qs, qs, *map(float, kw["coef"]), rl, True,
                                       float(kw.get("kq", np.inf)), 0, dec16, shift, scale, special, True,
                                       float(kw["frac_k"]))
    return got, want, not info[0]




def _output(rng, e, dt, kind):
    if kind == "rounded":
        with np.errstate(over="ignore"):
            a = e.astype(dt)
        a[~np.isfinite(a.astype(np.float64))] = 0.0
        return a
    with np.errstate(over="ignore"):
        a = (e + rng.standard_normal(e.size) * (1e-2 if kind == "noisy" else 3.0) * (np.abs(e) + 1.0)).astype(dt)
    a[~np.isfinite(a.astype(np.float64))] = 1.0
    return a


def _magnitude(rng, e, kind):
    n = e.size
    m = np.abs(e) * rng.uniform(1.0, 3.0, n) + rng.uniform(0, 2, n)
    if kind == "low":  # some below |e| (1 - 1e-6), some just at it
        k = rng.random(n) < 0.05
        m[k] = np.abs(e[k]) * rng.uniform(0.0, 1.0 - 2e-6, int(k.sum()))
        k = rng.random(n) < 0.05
        m[k] = np.abs(e[k]) * (1.0 - 1e-6)  # at the test's edge
    elif kind == "negative":  # |m| is still a scale; the magnitude fails its test
        k = rng.random(n) < 0.02
        m[k] = -m[k]
        m[rng.random(n) < 0.02] = -0.0
    return m


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_record_pass_is_the_kernel_pass(dtype):
    """Random, heavy-tailed, wide-range, zero-heavy and representable references; noisy,
    failing and correctly rounded outputs, stored in the format or in float32/float64;
    with and without a magnitude (also negative or low ones, which the record reports but
    does not refer), with and without rows (one element, shorter and longer than a block,
    a last partial row, rows across blocks, a row longer than the output): every field,
    bit for bit, and a finite pair takes the blocked kernel."""
    rng = np.random.default_rng(100 + DTYPES.index(dtype))
    dt = _np(dtype)
    taken = 0
    for trial in range(120):
        n = int(rng.choice([0, 1, 7, 255, 256, 257, 1000, 3001]))
        e = op_reference(rng, n, ("normal", "heavy", "wide", "grid", "zeros")[trial % 5])
        out_dt = (dt, dt, np.float32, np.float64)[trial % 4] if trial % 3 else dt
        a = _output(rng, e, out_dt, ("noisy", "failing", "rounded")[trial % 3])
        m = None if trial % 2 else _magnitude(rng, e, ("good", "low", "negative")[trial // 2 % 3])
        rowlen = (None, 1, 7, 64, 300, max(1, n), 5000)[trial % 7]
        kq = 2.0e4 if trial % 4 else 0.5  # exceedance counts, both far and near
        frac_k = (1.0, 0.0, 3.0)[trial % 3]
        got, want, blocked = _both(a, e, m, coef=COEF, frac_k=frac_k, rowlen=rowlen, dtype=dtype, kq=kq)
        assert _same(got, want) is None, (trial, n, _same(got, want))
        finite = np.isfinite(a.astype(np.float64) - e).all()
        if finite:
            assert blocked, (trial, n)
            taken += 1
    assert taken > 80


@pytest.mark.parametrize("what", ["nan output", "inf output", "nan reference", "inf reference", "nan magnitude",
                                  "inf magnitude", "matched inf", "matched nan", "zero scale", "huge difference"])
@pytest.mark.parametrize("j", [0, 255, 256, 517, 699])
def test_non_finite_pairs_are_the_kernel_pass(what, j):
    """A NaN or Inf in the output, the reference or the magnitude, matched infinities and
    NaNs, ``0 / 0`` of a zero scale, a difference beyond float64's range, at the start,
    the end and block edges: every field of ``_op_kernel`` (its ``bad`` flags and
    ``nonfinite`` index included)."""
    rng = np.random.default_rng(j)
    e = rng.standard_normal(700) * 8.0
    a = (e + rng.standard_normal(700) * 1e-2).astype(np.float16)
    m = np.abs(e) + 1.0
    coef = COEF
    dtype = "float16"
    if what.endswith("output"):
        a[j] = np.nan if what.startswith("nan") else -np.inf
    elif what.endswith("reference"):
        e[j] = np.nan if what.startswith("nan") else np.inf
    elif what == "nan magnitude":
        m[j] = np.nan
    elif what == "inf magnitude":
        m[j] = np.inf
    elif what == "matched inf":
        a[j], e[j] = np.inf, np.inf
    elif what == "matched nan":
        a[j], e[j] = np.nan, np.nan
    elif what == "zero scale":  # no D: s = 0 where e = m = 0, d / s = 0 / 0 at an exact output
        coef = (*COEF[:3], 0.0)
        e[:j + 1] = 0.0
        a[:j + 1] = 0.0
        m[:j + 1] = 0.0
    else:
        a = a.astype(np.float64)
        a[j], e[j] = 1.5e308, -1.5e308
        dtype = "float64"
    for mm in (m, None):
        for rowlen in (None, 7, 256):
            got, want, blocked = _both(a, e, mm, coef=coef, frac_k=1.0, rowlen=rowlen, dtype=dtype, kq=3.0)
            assert _same(got, want) is None, (what, rowlen, _same(got, want))
            if what not in ("nan magnitude", "inf magnitude") or mm is not None:
                assert not blocked, (what, rowlen)  # referred


def test_a_zero_scale_before_the_worst_element_is_referred():
    """``_op_kernel``'s worst element skips a NaN ``|d| / s0`` (``0 / 0``), its maximum
    does not see it: a first element ``0 / 0`` and a second of score 0 make the worst
    element 1, not 0. The blocked kernels refer such a pair (the check's too)."""
    e = np.array([0.0, 1.0, 2.0])
    a = e.astype(np.float16)
    coef = (*COEF[:3], 0.0)
    got, want, blocked = _both(a, e, None, coef=coef, frac_k=1.0, rowlen=None, dtype="float16")
    assert want.worst == 1 and not blocked
    assert _same(got, want) is None
    assert fused.op_check_statistics(a, e, None, coef=coef, rowlen=None, dtype="float16", kq=3.0) is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float32"])
def test_magnitudes_failing_their_tests_are_reported_as_the_kernel_does(dtype):
    """Negative, ``-0`` and low magnitudes in the first block, a later block only, or both,
    with non-finite values elsewhere or not: the first bad and first low index of
    ``_op_kernel``, from the blocked kernel where the pair is finite."""
    rng = np.random.default_rng(5)
    dt = _np(dtype)
    for trial in range(40):
        n = int(rng.choice([3, 300, 1000]))
        e = rng.standard_normal(n)
        a = (e * (1 + 0.01 * rng.standard_normal(n))).astype(dt)
        m = np.abs(e) + rng.uniform(0, 1, n)
        for _ in range(int(rng.integers(0, 4))):
            k = int(rng.integers(n))
            m[k] = (-m[k], -0.0, abs(e[k]) * 0.999, abs(e[k]) * (1 - 1e-6), abs(e[k]) * (1 - 1.1e-6))[trial % 5]
        if trial % 7 == 0:
            e[int(rng.integers(n))] = np.nan  # its magnitude is not tested
        got, want, blocked = _both(a, e, m, coef=COEF, frac_k=1.0, rowlen=(None, 10)[trial % 2], dtype=dtype)
        assert _same(got, want) is None, (trial, _same(got, want))
        assert blocked == bool(np.isfinite(a.astype(np.float64) - e).all())


def test_the_comparison_sees_a_difference():
    """The comparison the tests above use fails on one bit of any statistic, a ``bad``
    flag, an index or a count: the tests can fail."""
    rng = np.random.default_rng(1)
    e = rng.standard_normal(1000)
    a = (e * 1.001).astype(np.float16)
    m = np.abs(e) + 0.5
    m[[3, 700]] = -1.0
    p = op_statistics(a, e, m, coef=COEF, frac_k=1.0, rowlen=10, dtype="float16")
    assert _same(p, _kernel_pass(a, e, m, coef=COEF, frac_k=1.0, rowlen=10, dtype="float16")) is None
    assert p.bad_magnitude == 3
    for i in range(p.stats.size):
        st = p.stats.copy().ravel()
        st.view(np.int64)[i] ^= 1
        assert _same(p._replace(stats=st.reshape(2, 9)), p) is not None
    assert _same(p._replace(stats=-p.stats), p) is not None
    assert _same(p._replace(bad=np.array([False, True])), p) is not None
    for f in OpPass._fields[2:]:
        assert _same(p._replace(**{f: getattr(p, f) + 1}), p) is not None
    # the sequential sums: the pairwise (numpy) order differs in the last bits, and is seen
    s = fused.op_statistics(a, e, None, coef=COEF, frac_k=1.0, rowlen=None, dtype="float16")
    z = (a.astype(np.float64) - e) / (COEF[0] * np.abs(e) + COEF[1] * np.abs(e) + COEF[3])
    assert s.stats[0, 2] != np.sum(np.abs(z)) or s.stats[0, 1] != np.sum(z * z)
