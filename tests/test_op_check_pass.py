"""The operator-form check's pass (:func:`tolstat.measure.fused.op_check_statistics`)
equals the full operator pass (:func:`tolstat.measure.fused.op_statistics`) bit for bit.

The check's pass computes, in blocks whose element-wise loop vectorises, the statistics a
combined score can hold, the worst element, the exceedance count and the correctly
rounded count; it refers a pair it does not cover (non-finite values, a magnitude that
fails its tests) to the full pass. Every number it returns, and every field of a check's
result, must be what the full pass gives.
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numba
import numpy as np
import pytest

import tolstat
from table_helpers import group as _group, table as _table
from tolstat._base.cast_kernels import decode16
from tolstat._base.dtypes import target_dtype
from tolstat.checks import checking
from tolstat.measure import fused
from tolstat.measure.fused import OP_CHECK_COLUMNS, op_check_statistics, op_statistics
from tolstat.measure.noise import MID_SUFFIX, SCORE_CORE
from kernel_helpers import op_reference, rounding_probe_values
from table_helpers import assert_same_result

DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
COEF = (2.0 ** -11, 2.0 ** -24 * 8.0, 2.0 ** -11 / 8.0, 2.0 ** -25)  # op_pass_coefficients of float16, K = 64


def _np(dtype):
    return target_dtype(dtype).np_dtype


def _bits_equal(x, y):
    """Equal float64 arrays, bit for bit (NaN patterns included)."""
    x, y = np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64)
    return x.shape == y.shape and np.array_equal(x.view(np.int64), y.view(np.int64))


@numba.njit
def _round_both(x, p, emin, mx, qinv, qs):  # pragma: no cover - numba
    out = np.empty((2, x.size))
    for i in range(x.size):
        out[0, i] = fused._round_ref(x[i], p, emin, mx)
        out[1, i] = fused._round_ref_select(x[i], p, emin, mx, qinv, qs)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_branch_free_rounding_is_the_rounding(dtype):
    """:func:`_round_ref_select` is :func:`_round_ref` bit for bit: every value of the
    format, midpoints (ties) and their neighbours, subnormals, values beyond the range,
    signed zeros and non-finite values."""
    td = target_dtype(dtype)
    rng = np.random.default_rng(11)
    x = rounding_probe_values(td, rng)
    p, emin, mx = fused.round_params(dtype)
    qs = math.ldexp(1.0, emin - p) if p > 0 else 1.0
    got = _round_both(x, p, emin, mx, 1.0 / qs, qs)
    assert _bits_equal(got[1], got[0])


@numba.njit
def _decode_all(codes, shift, scale, special):  # pragma: no cover - numba
    out = np.empty(codes.size)
    for i in range(codes.size):
        out[i] = decode16(codes[i], shift, scale, special)
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_16_bit_decoding_is_the_cast(dtype):
    """Every bit pattern decodes to the value of the format's own cast (the decode table),
    bit for bit; a NaN pattern to a NaN."""
    codes = np.arange(2 ** 16, dtype=np.uint16)
    got = _decode_all(codes, *fused._DECODE16[dtype])
    ref = fused.decode_table(_np(dtype))
    nan = np.isnan(ref)
    assert nan.any() and np.array_equal(np.isnan(got), nan)
    assert _bits_equal(got[~nan], ref[~nan])


def _same_pass(full, lean, rows):
    cols = list(OP_CHECK_COLUMNS) if rows else [0, 1, 3, 8]  # row statistics: only with rows
    assert _bits_equal(lean.stats[:, cols], full.stats[:, cols])
    assert np.isnan(lean.stats[:, [2, 4]]).all()  # not computed
    assert (lean.worst, lean.n_exceeding, lean.n_rounding_off) == (full.worst, full.n_exceeding, full.n_rounding_off)
    assert not full.bad.any() and not lean.bad.any()
    assert (lean.nonfinite, lean.bad_magnitude, lean.low_magnitude) == (-1, -1, -1)
    assert full.nonfinite == -1  # (the magnitude's tests: those asked for, by the caller)




def _output(rng, e, dt, kind):
    if kind == "rounded":
        with np.errstate(over="ignore"):
            a = e.astype(dt)
        fin = np.isfinite(a.astype(np.float64))
        a[~fin] = 0.0
        return a
    with np.errstate(over="ignore"):
        a = (e + rng.standard_normal(e.size) * (1e-2 if kind == "noisy" else 3.0) * (np.abs(e) + 1.0)).astype(dt)
    a[~np.isfinite(a.astype(np.float64))] = 1.0
    return a


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_check_pass_is_the_full_pass(dtype):
    """Random, heavy-tailed, wide-range, zero-heavy and representable references; noisy,
    failing and correctly rounded outputs, stored in the format or in float32/float64;
    with and without a magnitude, with and without rows (long, short, one element, a last
    partial row, rows across blocks): the same numbers, bit for bit."""
    rng = np.random.default_rng(DTYPES.index(dtype))
    dt = _np(dtype)
    kq = 2.0e4
    for trial in range(90):
        n = int(rng.choice([1, 7, 255, 256, 257, 1000, 3001]))
        e = op_reference(rng, n, ("normal", "heavy", "wide", "grid", "zeros")[trial % 5])
        out_dt = (dt, dt, np.float32, np.float64)[trial % 4] if trial % 3 else dt
        a = _output(rng, e, out_dt, ("noisy", "failing", "rounded")[trial % 3])
        if not np.isfinite(a.astype(np.float64) - e).all():
            continue
        m = None if trial % 2 else np.abs(e) * rng.uniform(1.0, 3.0, n) + rng.uniform(0, 2, n)
        rowlen = (None, 1, 7, 64, 300, max(1, n))[trial % 6]
        kqt = kq if trial % 4 else 0.5  # exceedance counts, both far and near
        full = op_statistics(a, e, m, coef=COEF, frac_k=1.0, rowlen=rowlen, dtype=dtype, kq=kqt)
        lean = op_check_statistics(a, e, m, coef=COEF, rowlen=rowlen, dtype=dtype, kq=kqt,
                                   magnitude_checks=2 if m is not None else 0)
        assert lean is not None, (trial, n)  # a finite pair with a good magnitude is covered
        _same_pass(full, lean, rowlen is not None)


@pytest.mark.parametrize("what", ["nan output", "inf output", "nan reference", "inf reference", "nan magnitude",
                                  "inf magnitude", "negative magnitude", "low magnitude", "matched inf"])
@pytest.mark.parametrize("checks", [0, 1, 2])
def test_what_the_check_pass_does_not_cover_is_referred(what, checks):
    """A pair with a non-finite difference, reference or scale is referred (None) to the
    full pass, and so is a magnitude that fails the tests asked for; one that fails only
    a test not asked for is covered, with the full pass's numbers."""
    rng = np.random.default_rng(4)
    e = rng.standard_normal(700) * 8.0
    a = (e + rng.standard_normal(700) * 1e-2).astype(np.float16)
    m = np.abs(e) + 1.0
    j = 517  # in the third block
    if what.endswith("output"):
        a[j] = np.nan if what.startswith("nan") else np.inf
    elif what.endswith("reference"):
        e[j] = np.nan if what.startswith("nan") else -np.inf
    elif what == "nan magnitude":
        m[j] = np.nan
    elif what == "inf magnitude":
        m[j] = np.inf
    elif what == "negative magnitude":
        m[j] = -abs(e[j]) - 1.0  # |m| is still a valid scale
    elif what == "low magnitude":
        m[j] = abs(e[j]) * 0.5
    else:
        a[j], e[j] = np.inf, np.inf
    full = op_statistics(a, e, m, coef=COEF, frac_k=1.0, rowlen=7, dtype="float16", kq=3.0)
    lean = op_check_statistics(a, e, m, coef=COEF, rowlen=7, dtype="float16", kq=3.0, magnitude_checks=checks)
    covered = ((what == "negative magnitude" and checks == 0) or (what == "low magnitude" and checks < 2))
    if covered:
        assert lean is not None
        _same_pass(full, lean, True)
    else:
        assert lean is None
        assert full.nonfinite >= 0 or full.bad.any() or full.bad_magnitude >= 0 or full.low_magnitude >= 0


# --------------------------------------------------------------------------- whole checks
_ALL = [*SCORE_CORE, *(k + MID_SUFFIX for k in SCORE_CORE)]


def _op_table(thr, normalisers, rowwise):
    g = _group("softmax", "float16", "*", thr, statistic="op_score")
    g["certificate"] = {"form": "operator", "method": "order_statistic", "normalisers": dict(normalisers),
                        "rowwise": rowwise, "covariates": ["K"], "needs_magnitude": False, "guarantee": "PAC: test"}
    return _table([g], statistic="op_score")






@pytest.mark.parametrize("rowwise", [True, False])
@pytest.mark.parametrize("normalisers", ["all", "some", "invariant"])
def test_operator_checks_decide_and_report_as_with_the_full_pass(monkeypatch, rowwise, normalisers):
    """``tolstat.check`` on an operator-form table: the same result, field for field and
    message, as with the full pass (the check's pass switched off), for passing, failing
    and correctly rounded outputs, row-wise outputs of several shapes, with a magnitude."""
    q = {"all": {k: 1.0 + i / 7 for i, k in enumerate(_ALL)},
         "some": {"op_max_mid": 3.0, "op_bias": 700.0, "op_row_bias_max": 2.0},
         "invariant": {"op_rms": 2.0, "inv_row_sum": 3.0, "op_row_rms_max_mid": 2.5}}[normalisers]
    rng = np.random.default_rng(9)
    cases = []
    for shape in [(1000,), (40, 25), (3, 5, 300), (1,), (600, 1)]:
        x = rng.standard_normal(shape)
        e = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
        cases += [(e.astype(np.float16), e),
                  ((e * (1 + 1e-3 * rng.standard_normal(shape))).astype(np.float16), e),
                  ((e * (1 + 0.3 * rng.standard_t(1.5, shape))).astype(np.float16), e)]
    seen = set()
    for thr in (1.0, 1e3):
        table = _op_table(thr, q, rowwise)
        for a, e in cases:
            mag = np.abs(e) + rng.uniform(0, 1, e.shape)
            kw = dict(op="softmax", dtype="float16", table=table, covariates={"K": 16},
                      options=tolstat.CheckOptions(magnitude=mag))
            lean = tolstat.check(a, e, **kw)
            with monkeypatch.context() as mp:
                mp.setattr(checking, "op_check_statistics", lambda *args, **kwargs: None)
                full = tolstat.check(a, e, **kw)
            assert_same_result(lean, full)
            seen.add((lean.passed, lean.correctly_rounded))
    assert {(True, True), (True, False), (False, False)} <= seen  # passing, correctly rounded and failing cases


def test_the_check_pass_is_used_for_tables_of_score_statistics():
    """Every statistic a combined score may hold is computed by the check's pass (the
    columns of ``OP_CHECK_COLUMNS``): a table of them takes it."""
    ent = _op_table(1.0, {k: 1.0 for k in _ALL} | {"inv_row_sum": 1.0}, True).entry("softmax", "float16", "*")
    assert checking._op_constants(ent).lean
    assert set(SCORE_CORE) == {"op_max", "op_rms", "op_bias", "op_sbias", "op_row_rms_max", "op_row_bias_max"}
    assert {0, 1, 3, 5, 7, 8} <= set(OP_CHECK_COLUMNS)


def test_a_bfloat16_and_a_float8_output_are_read_as_their_values():
    """The check's pass reads a bfloat16 output by its bits (:func:`decode16`) and a
    float8 output through its decode table: the full pass's numbers."""
    rng = np.random.default_rng(2)
    e = rng.standard_normal(1500)
    for dt, name in ((ml_dtypes.bfloat16, "bfloat16"), (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
                     (np.float16, "bfloat16")):
        a = (e * (1 + 0.01 * rng.standard_normal(e.size))).astype(dt)
        full = op_statistics(a, e, None, coef=COEF, frac_k=1.0, rowlen=None, dtype=name, kq=5.0)
        lean = op_check_statistics(a, e, None, coef=COEF, rowlen=None, dtype=name, kq=5.0)
        assert lean is not None
        _same_pass(full, lean, False)
