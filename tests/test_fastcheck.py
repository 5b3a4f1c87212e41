"""The fast check path (one fused pass) gives the CheckResult of the general path."""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

import tolstat
from table_helpers import group as _group, stat as _stat, table as _table
from tolstat.checks.fast import cached_entry, fast_check
from tolstat.measure.fused import decode_table
from tolstat.checks.checking import check_metrics
from tolstat.measure.metrics import error_metrics
from tolstat.models import statistics as _stats

# these tests compare the check's paths on outputs larger than the calibration runs, on purpose
pytestmark = pytest.mark.filterwarnings("ignore::tolstat.checks.checking.CalibrationRangeWarning")


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(0)
    out = {}
    for dt, np_dt in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16), ("float32", np.float32)):
        pairs = []
        for _ in range(200):  # >= 146 runs: the order statistic at budget 0.025, confidence 0.975
            e = rng.standard_normal(64)
            pairs.append((e.astype(np_dt), e))
        ds = tolstat.from_pairs(pairs, op="add", dtype=dt)
        for stats in (["max_abs"], ["max_rel", "bias"], ["max_abs", "bias"]):
            out[dt, tuple(stats)] = tolstat.select(ds, form=None, fp_budget=0.05, statistic=stats)
    return out


def _general(a, e, dt, table):
    ent = table.entry("add", dt)
    return check_metrics(error_metrics(a, e, dtype=dt), a, e, ent, None)


def _same(fast, ref):
    """Every field equal (the fused sums are numpy's pairwise sums: ``bias`` too is exact)."""
    fast, r = dataclasses.asdict(fast), dataclasses.asdict(ref)
    assert set(fast) == set(r)
    for k, v in r.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(fast[k]), k
        else:
            assert fast[k] == v, k


@pytest.mark.parametrize("dt,np_dt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
                                       ("float32", np.float32)])
@pytest.mark.parametrize("stats", [("max_abs",), ("max_rel", "bias"), ("max_abs", "bias")])
@pytest.mark.parametrize("scale", [1.0, 40.0])  # passing, and failing with many exceedances
def test_fast_path_equals_general_path(tables, dt, np_dt, stats, scale):
    rng = np.random.default_rng(1)
    e = rng.standard_normal((37, 29)) * np.exp(rng.uniform(-8, 3, (37, 29)))
    a = e.astype(np_dt)
    if scale != 1.0:
        a = (e + scale * (a.astype(np.float64) - e)).astype(np_dt)
    table = tables[dt, stats]
    ent = table.entry("add", dt)
    fast = fast_check(a, e, ent, None)
    assert fast is not None
    ref = _general(a, e, dt, table)
    _same(fast, ref)  # passed or failed, the fast result is final and equals the general path
    assert tolstat.check(a, e, op="add", dtype=dt, table=table) == fast
    if scale != 1.0:
        assert not ref.passed and ref.n_exceeding > 0 and not fast.passed
    elif "bias" not in stats:  # a correctly rounded output always passes a max-error check
        assert ref.passed


def test_fast_path_ties_noncontiguous_and_float32_reference(tables):
    table = tables["float16", ("max_abs",)]
    e = np.zeros((50, 40))
    e[::7, ::3] = 1e-3  # many equal errors: the first argmax is reported
    a = e.astype(np.float16)
    at, et = a.T, e.T  # non-contiguous views
    fast = fast_check(at, et, table.entry("add", "float16"), None)
    _same(fast, _general(at, et, "float16", table))
    e32 = et.astype(np.float32)
    _same(fast_check(at, e32, table.entry("add", "float16"), None), _general(at, e32, "float16", table))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_pairs_take_the_general_path(tables, bad):
    table = tables["float16", ("max_abs", "bias")]
    e = np.linspace(-1, 1, 100)
    a = e.astype(np.float16)
    a[17] = bad
    assert fast_check(a, e, table.entry("add", "float16"), None) is None
    r = tolstat.check(a, e, op="add", dtype="float16", table=table)
    assert not r.passed and r.n_nonfinite == 1 and r.worst_index == (17,)
    with pytest.raises(ValueError, match="reference .* NaN"):
        tolstat.check(e.astype(np.float16), np.where(np.arange(100) == 3, np.nan, e), op="add",
                      dtype="float16", table=table)


def test_unsupported_entries_take_the_general_path(tables):
    rng = np.random.default_rng(2)
    pairs = [(e.astype(np.float16), e) for e in rng.standard_normal((100, 32))]
    ds = tolstat.from_pairs(pairs, op="add", dtype="float16")
    table = tolstat.select(ds, form=None, fp_budget=0.05, statistic="max_ulp")
    e = rng.standard_normal(32)
    assert fast_check(e.astype(np.float16), e, table.entry("add", "float16"), None) is None
    assert tolstat.check(e.astype(np.float16), e, op="add", dtype="float16", table=table).passed


def test_shape_and_dtype_errors_are_still_raised(tables):
    table = tables["float16", ("max_abs",)]
    with pytest.raises(ValueError, match="shape mismatch"):
        tolstat.check(np.zeros(3, np.float16), np.zeros(4), op="add", dtype="float16", table=table)
    with pytest.raises(TypeError, match="integer/bool dtype"):
        tolstat.check(np.zeros(3, np.int32), np.zeros(3), op="add", dtype="float16", table=table)


def test_decode_table_is_the_exact_cast():
    for dt in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        lut = decode_table(np.dtype(dt))
        codes = np.arange(lut.size, dtype=np.uint8 if lut.size == 256 else np.uint16)
        with np.errstate(invalid="ignore"):
            ref = codes.view(dt).astype(np.float64)
        np.testing.assert_array_equal(lut, ref)
    assert decode_table(np.dtype(np.float32)) is None




def test_entry_cache_follows_table_data(tables):
    table = tables["float16", ("max_abs",)]
    t2 = tolstat.ToleranceTable(table.data.copy(deep=True))
    e1 = cached_entry(t2, "add", "float16", None)
    assert cached_entry(t2, "add", "float16", None) is e1
    new = t2.data.copy(deep=True)
    new["threshold"][...] = new["threshold"].values * 2
    t2.data = new
    e2 = cached_entry(t2, "add", "float16", None)
    assert e2.statistics["max_abs"].threshold == 2 * e1.statistics["max_abs"].threshold


# --------------------------------------------------------------------------- fast path values
# The fast path's own values against the definitions.
# A fast *failure* is re-checked on the general path, so a fast path that computes a statistic
# wrongly would only show as a failing fast pass; these tests compare the values themselves.


def test_fast_bias_and_max_rel_values_are_the_definitions():
    e = np.array([0.0, 1.0, -2.0, 0.5, 3.0])
    a = np.array([np.float16(6e-8), 1.0, -2.001, 0.5, 3.002], dtype=np.float16)  # e[0] = 0: rel floor
    t = _table([_group("op", "float16", "*", 1e9, statistic="max_rel", extra={"bias": _stat(1e9)})],
               statistic="max_rel", extra=("bias",))
    ent = t.entry("op", "float16")
    fast = fast_check(a, e, ent, None)
    d = a.astype(np.float64) - e
    tiny = float(np.finfo(np.float16).tiny)
    rel = np.abs(d) / np.maximum(np.abs(e), tiny)
    assert fast.statistics["max_rel"] == pytest.approx(rel.max(), rel=1e-15)
    assert fast.statistics["bias"] == pytest.approx(math.sqrt(d.size) * abs(d.mean()) / np.abs(d).mean(), rel=1e-12)
    assert fast.passed


def test_fast_path_rejects_non_float_arrays_naming_them():
    t = _table([_group("op", "float32", "*", 1.0)])
    ent = t.entry("op", "float32")
    with pytest.raises((TypeError, ValueError), match="actual"):
        fast_check(np.array([1, 2]), np.array([1.0, 2.0]), ent, None)
    with pytest.raises((TypeError, ValueError), match="expected"):
        fast_check(np.array([1.0, 2.0], np.float32), np.array([1, 2]), ent, None)


def test_entry_with_a_statistic_the_fast_path_does_not_know_takes_the_general_path(monkeypatch):
    extra = _stats.Statistic(name="twice_bias", kind="run", unit="-", description="twice the bias",
                             needs=(), from_dataset=lambda ds, model=None: _stats.RunScores(np.zeros(1)),
                             from_metrics=lambda m, model, cov, dt: 2.0 * _stats.get("bias").value(m))
    monkeypatch.setitem(_stats.REGISTRY, extra.name, extra)
    t = _table([_group("op", "float32", "*", 1.0, extra={extra.name: _stat(1e9)})], extra=(extra.name,))
    ent = t.entry("op", "float32")
    a, e = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0])
    assert fast_check(a, e, ent, None) is None
    r = tolstat.check(a, e, op="op", dtype="float32", table=t)
    assert r.passed and set(r.statistics) == {"max_abs", extra.name}


def test_fast_pass_reports_the_certificate_guarantee():
    g = _group("op", "float32", "*", 1.0)
    g["certificate"] = {"guarantee": "PAC: for this test"}
    t = _table([g])
    a, e = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0])
    fast = fast_check(a, e, t.entry("op", "float32"), None)
    assert fast.passed and fast.guarantee == "PAC: for this test"
    assert tolstat.check(a, e, op="op", dtype="float32", table=t).guarantee == "PAC: for this test"


def test_check_of_empty_arrays_is_refused_on_the_fast_path_too():
    t = _table([_group("op", "float32", "*", 1e-3)])  # a max_abs entry: the fast path applies
    with pytest.raises(ValueError, match="empty arrays: nothing to compare"):
        tolstat.check(np.array([], np.float32), np.array([]), op="op", dtype="float32", table=t)


def test_fast_scale_check_reports_the_allclose_pair_of_its_covariates():
    """``(atol, rtol)`` of a scale-model check is ``ToleranceEntry.allclose`` at the run's
    covariates: the power covariate's factor ``(N / 4) ** 0.5 = 2`` multiplies both."""
    g = _group("add", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = {"form": "allclose", "atol": 0.5, "rtol": 0.25, "unit": 1e-3, "linear": {"K": 0.125},
                  "power": {"N": [0.5, 4.0]}}
    table = _table([g], statistic="max_score")
    ent = table.entry("add", "float32")
    cov = {"K": 8.0, "N": 16.0}
    e = np.random.default_rng(3).standard_normal(50)
    a = e.astype(np.float32)
    fast = fast_check(a, e, ent, cov)
    assert fast is not None
    want = ent.allclose(cov)
    assert want == pytest.approx((2.0 * 1e-3 * (0.5 + 0.125 * 8.0) * 2.0, 2.0 * 1e-3 * 0.25 * 2.0), rel=1e-14)
    assert (fast.atol, fast.rtol) == want
    _same(fast, check_metrics(error_metrics(a, e, dtype="float32"), a, e, ent, cov))
