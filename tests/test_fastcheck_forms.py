"""The fused check path equals the definition bit for bit, for a table of every form.

The definition is the general path: :func:`tolstat.error_metrics` and
:func:`tolstat.checks.checking.check_metrics`, whose decision values are
:func:`tolstat.calibration.decision.pair_value`. ``tolstat.check`` takes the fused path
(:mod:`tolstat.checks.fast`) for finite pairs and returns its result, passed or failed, as
final; every field of it (verdict, statistic values, worst element, counts, allclose form,
probabilities and the message) must be the definition's.
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import ml_dtypes
import numba
import numpy as np
import pytest

import tolstat
from tolstat._base.dtypes import round_to_format, target_dtype
from tolstat.measure.noise import rounded_reference
from tolstat.calibration.bounds import exceedance_probability
from tolstat.calibration.decision import (beyond_calibrated_size, exceeds, pair_is_correctly_rounded, pair_value, ratio,
                                         ratio_value)
from tolstat.checks import checking as _checking
from tolstat.checks.checking import check_metrics
from tolstat.checks.fast import cr_mode, fast_check, plan_of
from tolstat.measure import fused
from tolstat.measure.fused import check_pass, error_sums, format_layout, sum_of_squares
from tolstat.measure.metrics import as_array, error_metrics, metric_covariates, ulp_distance
from kernel_helpers import rounding_probe_values
from table_helpers import assert_same_result

# these tests compare the check's paths on outputs larger than the calibration runs, on purpose
pytestmark = pytest.mark.filterwarnings("ignore::tolstat.checks.checking.CalibrationRangeWarning")

K = 64
FORMS = ("auto", "None", "allclose", "size_aware", "normalised", "baseline", "operator", "max_rel+bias",
         "max_abs+bias")
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _pair(rng, n, dt, k=K, noise=0.5):
    e = rng.standard_normal(n) * np.sqrt(k)
    eps = float(ml_dtypes.finfo(dt).eps)
    return (e + rng.standard_normal(n) * noise * eps * (np.abs(e) + np.sqrt(k))).astype(dt), e


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def tables(request):
    dtype = request.param
    dt = NP[dtype]
    rng = np.random.default_rng(0)
    plain, cov, mag = [], [], []
    for _ in range(240):
        k = int(rng.choice([16, 64, 256]))
        a, e = _pair(rng, 64, dt, k)
        base = float(np.abs(e - (e + rng.standard_normal(64) * 1e-3 * np.sqrt(k))).max())
        plain.append((a, e))
        cov.append((a, e, None, {"K": k, "baseline_max_abs": base}))
        mag.append((a, e, np.abs(e) + np.sqrt(k)))
    kw = dict(op="sum", dtype=dtype, hardware="cpu")
    ds, dsc, dsm = (tolstat.from_pairs(p, **kw) for p in (plain, cov, mag))
    out = {
        "auto": tolstat.select(ds, fp_budget=0.05),
        "None": tolstat.select(ds, fp_budget=0.05, form=None),
        "allclose": tolstat.select(ds, fp_budget=0.05, form="allclose"),
        "size_aware": tolstat.select(dsc, fp_budget=0.05, form="size_aware"),
        "normalised": tolstat.select(dsc, fp_budget=0.05, form="normalised"),
        "baseline": tolstat.select(dsc, fp_budget=0.05, form="baseline"),
        "operator": tolstat.select(dsm, fp_budget=0.05),
        "max_rel+bias": tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_rel", "bias"]),
        "max_abs+bias": tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"]),
    }
    return dtype, out


def _kwargs(form, e):
    kw = {}
    if form == "size_aware":
        kw["covariates"] = {"K": K}
    elif form == "baseline":
        kw["covariates"] = {"baseline_max_abs": 8e-3}
    elif form == "operator":
        kw["magnitude"] = np.abs(np.asarray(e, dtype=np.float64)) + np.sqrt(K)
    return kw


def _ck(kw, allow_nan=False):
    """``check``'s keywords of ``kw`` (the magnitude travels in ``CheckOptions``)."""
    out = {k: v for k, v in kw.items() if k != "magnitude"}
    out["options"] = tolstat.CheckOptions(magnitude=kw.get("magnitude"), allow_nan=allow_nan)
    return out


def _cases(dtype):
    """(name, actual, expected): random and adversarial pairs."""
    dt = NP[dtype]
    rng = np.random.default_rng(5)
    a, e = _pair(rng, 1000, dt)
    out = [("noisy", a, e)]
    a2, e2 = _pair(rng, 37 * 29, dt)
    out.append(("noisy 2-d", a2.reshape(37, 29), e2.reshape(37, 29)))
    out.append(("non-contiguous", a2.reshape(37, 29).T, e2.reshape(37, 29).T))
    out.append(("float32 reference", a, e.astype(np.float32)))
    out.append(("correctly rounded", e.astype(dt), e))
    one = e.astype(dt)
    one[17] = np.nextafter(one[17], dt(np.inf))
    out.append(("one ulp off", one, e))
    z = e.copy()
    z[::3] = 0.0
    az = z.astype(dt)
    az[3] = dt(1e-3)  # an error where the reference is 0
    out.append(("zeros in ref", az, z))
    out.append(("all zero", np.zeros(50, dt), np.zeros(50)))
    t = np.zeros(200)
    at = t.astype(dt)
    at[[7, 50, 120]] = dt(0.25)  # three equal worst errors: the first is reported
    out.append(("ties", at, t))
    af, ef = _pair(rng, 1000, dt, noise=40.0)
    out.append(("failing", af, ef))
    out.append(("0-d", np.asarray(a[0]), np.asarray(e[0])))
    out.append(("float32 output", (e + 1e-3 * rng.standard_normal(e.size)).astype(np.float32), e))
    out.append(("float64 output, correctly rounded", e.astype(dt).astype(np.float64), e))
    grid = np.round(e * 4) / 4  # representable references: exact outputs, ties of the rounding
    out.append(("grid", grid.astype(dt), grid))
    return out






def _definition(a, e, ent, kw, allow_nan=False):
    a_, e_ = as_array(a), as_array(e)
    m = error_metrics(a_, e_, dtype=ent.dtype, allow_nan=allow_nan)
    return m, check_metrics(m, a_, e_, ent, kw.get("covariates"), magnitude=kw.get("magnitude"))


def _fast(a, e, ent, kw):
    if ent.operator:
        return _checking._fast_operator(as_array(a), as_array(e), ent, kw.get("covariates"), kw.get("magnitude"),
                                        op="sum", given=kw.get("magnitude") is not None)
    return fast_check(as_array(a), as_array(e), ent, kw.get("covariates"))


@pytest.mark.parametrize("form", FORMS)
def test_fast_path_equals_the_definition(tables, form):
    dtype, tabs = tables
    table = tabs[form]
    ent = table.entry("sum", dtype, "cpu")
    for name, a, e in _cases(dtype):
        kw = _kwargs(form, e)
        fast = _fast(a, e, ent, kw)
        assert fast is not None, (form, name)  # the fused path applies to every finite pair
        r = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu", **_ck(kw))
        m, ref = _definition(a, e, ent, kw)
        assert_same_result(r, ref, types=True)
        assert_same_result(fast, ref, types=True)
        if not ent.operator:  # the decision value is decision.pair_value's, bit for bit, carried to the
            # output's size where it is larger than every calibration run (decision.beyond_calibrated_size)
            cov = metric_covariates(m, kw.get("covariates"))
            want = beyond_calibrated_size({k: pair_value(m, k, ent.scale, cov, ent.dtype) for k in ent.statistics},
                                          ent, m.n_elements)
            for k in ent.statistics:
                assert r.statistics[k] == want[k], (form, name, k)
        assert r.correctly_rounded == pair_is_correctly_rounded(m), (form, name)
        if name in ("correctly rounded", "float64 output, correctly rounded", "all zero"):
            assert r.correctly_rounded and r.passed
        if name == "ties":
            assert r.worst_index == (7,)
        if name == "failing":
            assert not r.passed


@pytest.mark.parametrize("form", ["auto", "None", "operator", "max_abs+bias"])
@pytest.mark.parametrize("bad", ["nan output", "inf output", "-inf output", "nan pair", "nan reference"])
def test_non_finite_pairs_take_the_general_path(tables, form, bad):
    dtype, tabs = tables
    dt = NP[dtype]
    table = tabs[form]
    ent = table.entry("sum", dtype, "cpu")
    a, e = _pair(np.random.default_rng(2), 300, dt)
    e = e.copy()
    allow = bad in ("nan pair", "nan reference")
    if bad.endswith("output"):
        a[11] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[bad.split()[0]]
    elif bad == "nan pair":  # a matching NaN: no error with allow_nan
        a[11], e[11] = np.nan, np.nan
    else:
        e[11] = np.nan
    kw = _kwargs(form, e)
    assert _fast(a, e, ent, kw) is None
    r = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu", **_ck(kw, allow))
    assert_same_result(r, _definition(a, e, ent, kw, allow_nan=allow)[1], types=True)
    if not allow:
        with pytest.raises(ValueError, match="reference .* NaN"):
            tolstat.check(a, np.where(np.arange(300) == 4, np.nan, e), op="sum", dtype=dtype, table=table,
                          hardware="cpu", **_ck(kw))


def test_missing_covariates_and_magnitude_raise_as_before(tables):
    dtype, tabs = tables
    a, e = _pair(np.random.default_rng(3), 100, NP[dtype])
    with pytest.raises(ValueError, match="'K'"):
        tolstat.check(a, e, op="sum", dtype=dtype, table=tabs["size_aware"], hardware="cpu")
    with pytest.raises(ValueError, match="baseline_max_abs"):
        tolstat.check(a, e, op="sum", dtype=dtype, table=tabs["baseline"], hardware="cpu")
    with pytest.raises(ValueError, match="pass inputs="):
        tolstat.check(a, e, op="sum", dtype=dtype, table=tabs["operator"], hardware="cpu")
    with pytest.raises(ValueError, match="must be > 0"):
        tolstat.check(a, e, op="sum", dtype=dtype, table=tabs["size_aware"], hardware="cpu", covariates={"K": -1})


def test_probabilities_are_estimated_on_first_access(tables):
    dtype, tabs = tables
    table = tabs["auto"]
    ent = table.entry("sum", dtype, "cpu")
    a, e = _pair(np.random.default_rng(4), 500, NP[dtype])
    r = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu")
    assert "probabilities" not in vars(r)  # not needed for the verdict
    found = {k: exceedance_probability(v, ent.statistics[k]) for k, v in r.statistics.items()}
    assert r.probabilities == {k: f.probability for k, f in found.items()}
    assert r.notes == {k: f.note for k, f in found.items()}
    r2 = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu")
    assert pickle.loads(pickle.dumps(r2)) == r  # lazy on both sides, then equal
    assert dataclasses.replace(r2, methods={}).probabilities == r.probabilities
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        r.nope  # noqa: B018


def test_ratios_are_made_on_first_access_as_the_decision_defines_them(tables):
    dtype, tabs = tables
    table = tabs["auto"]
    a, e = _pair(np.random.default_rng(5), 500, NP[dtype])
    r = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu")
    assert "ratios" not in vars(r)  # not needed for the verdict
    assert r.ratios == {k: float(ratio(v, r.thresholds[k])) for k, v in r.statistics.items()}
    assert set(r.failed) == {k for k, v in r.ratios.items() if v > 1.0}
    r2 = tolstat.check(a, e, op="sum", dtype=dtype, table=table, hardware="cpu")
    assert pickle.loads(pickle.dumps(r2)).ratios == r.ratios
    assert dataclasses.replace(r2, methods={}).ratios == r.ratios
    assert r2 == r


# --------------------------------------------------------------------------- correctly rounded, exactly
def _boundary_references(name, rng):
    """References on and next to every rounding boundary of a format (ties, the overflow
    edge, the subnormal range), with both signs."""
    td = target_dtype(name)
    dt = td.np_dtype
    if td.bits <= 16:
        with np.errstate(invalid="ignore"):
            vals = np.arange(2 ** td.bits, dtype=td.uint_dtype).view(dt).astype(np.float64)
    else:
        x = rng.standard_normal(4000) * np.exp(rng.uniform(-80, 80, 4000))
        fi = np.finfo(dt)
        with np.errstate(over="ignore"):
            vals = np.concatenate([x, [fi.max, fi.tiny, fi.smallest_subnormal, 0.0]]).astype(dt).astype(np.float64)
    vals = np.unique(np.abs(vals[np.isfinite(vals)]))
    vals = np.unique(np.concatenate([vals, -vals]))
    mids = (vals[1:] + vals[:-1]) / 2
    fi = np.finfo(dt) if name in ("float16", "float32", "float64") else ml_dtypes.finfo(dt)
    _, ex = np.frexp(np.float64(td.max))
    with np.errstate(over="ignore"):
        top = td.max + float(np.ldexp(1.0, int(ex) - int(fi.nmant) - 2))  # max + ulp(max)/2: the overflow edge
    edge = [top, np.nextafter(top, 0), np.nextafter(top, np.inf), td.max * (1 + 1e-9), 1e300, 1e-300, 5e-324]
    c = np.concatenate([vals, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), edge, -np.array(edge)])
    return c[np.isfinite(c)]


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float32", "float64"])
def test_correctly_rounded_flag_is_the_ulp_definition(name):
    rng = np.random.default_rng(9)
    td = target_dtype(name)
    lay = format_layout(name)
    e_all = _boundary_references(name, rng)
    with np.errstate(over="ignore", invalid="ignore"):
        rn = round_to_format(e_all, name, overflow="clamp").astype(np.float64)
    with np.errstate(over="ignore"):
        outs = (rn, np.nextafter(rn, np.inf), np.nextafter(rn, -np.inf), -rn, np.zeros_like(rn))
    for out in outs:
        with np.errstate(over="ignore", invalid="ignore"):
            a = out.astype(td.np_dtype)
            keep = np.isfinite(a.astype(np.float64)) & np.isfinite(a.astype(np.float64) - e_all)
        a, e = a[keep], e_all[keep]
        if a.size > 3000:
            pick = rng.choice(a.size, 3000, replace=False)
            a, e = a[pick], e[pick]
        ref = ulp_distance(a, e, name) == 0
        mode = cr_mode(a, td)
        assert mode != "loose"  # an output in the format: the exact test of the pass
        got = np.array([check_pass(a[i:i + 1], e[i:i + 1], mode="abs", threshold=1.0, cr=mode,
                                   layout=lay).correctly_rounded for i in range(a.size)])
        np.testing.assert_array_equal(got, ref, err_msg=name)
    # the whole array: every element, in one pass
    with np.errstate(over="ignore", invalid="ignore"):
        a = rn.astype(td.np_dtype)
        keep = np.isfinite(a.astype(np.float64)) & np.isfinite(a.astype(np.float64) - e_all)
    a, e = np.ascontiguousarray(a[keep]), np.ascontiguousarray(e_all[keep])
    whole = check_pass(a, e, mode="abs", threshold=1.0, cr=cr_mode(a, td), layout=lay).correctly_rounded
    assert whole == bool(np.all(ulp_distance(a, e, name) == 0))


# --------------------------------------------------------------------------- numpy's sums, the ratio
@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, ml_dtypes.float8_e4m3fn])
def test_pairwise_sums_are_numpys_bit_for_bit(dt):
    rng = np.random.default_rng(1)
    for n in list(range(1, 140)) + [255, 256, 257, 1000, 4097, 8192, 70001, 300_000]:
        e = rng.standard_normal(n) * np.exp(rng.uniform(-6, 6, n))
        with np.errstate(over="ignore"):
            a = np.clip(e, -400, 400).astype(dt)
        d = a.astype(np.float64) - e
        assert sum_of_squares(e) == np.sum(np.square(np.abs(e)))
        s, sa = error_sums(a, e)
        assert s == np.sum(d) and sa == np.sum(np.abs(d)), n
        assert s / n == d.mean() and sa / n == np.abs(d).mean()
        assert math.sqrt(sum_of_squares(e) / n) == float(np.sqrt(np.mean(np.square(np.abs(e)))))


def test_ratio_value_and_scalar_exceeds_are_the_array_definitions():
    xs = [0.0, -0.0, 5e-324, 1e-300, 0.5, 1.0, float(np.nextafter(1.0, 2.0)), 2.0, 1e300, math.inf, math.nan]
    for x in xs:
        for thr in [0.0, 5e-324, 1e-300, 0.5, 1.0, 2.0, 1e300, math.inf, math.nan]:
            with np.errstate(over="ignore"):
                want = float(ratio(x, thr))
            got = ratio_value(x, thr)
            assert (math.isnan(got) and math.isnan(want)) or got == want, (x, thr, got, want)
            assert exceeds(x, thr) == bool(np.greater(x, thr))


# --------------------------------------------------------------------------- the operator kernel
def _op_kernel_reference(a, e, rn, m, use_m, A, B, C, D, frac_k, rowlen):  # pragma: no cover - numba
    """The operator-statistics kernel as first written (per shape in arrays, a modulo per
    element): the rewritten :func:`tolstat.measure.fused._op_kernel` must equal it."""
    out = np.zeros((2, 9))
    out[:, 5] = -1.0
    bad = np.zeros(2, dtype=np.bool_)
    n = e.size
    rs2 = np.zeros(2)
    rd = np.zeros(2)
    rss = np.zeros(2)
    for i in range(n):
        av = a[i]
        ev = e[i]
        ae = abs(ev)
        mv = m[i] if use_m else ae
        base = A * ae + B * mv
        d = av - ev
        b = av - rn[i]
        same = av == ev or (np.isnan(av) and np.isnan(ev))
        sg = 1.0 if ev > 0 else (-1.0 if ev < 0 else 0.0)
        for j in range(2):
            s = (base + C * mv) + D if j == 1 else base + D
            dj = d
            bj = b if np.isfinite(b) else 0.0
            if not (np.isfinite(d) and np.isfinite(s)):
                if not same:
                    bad[j] = True
                dj = 0.0
                bj = 0.0
                s = 1.0
            z = dj / s
            zb = bj / s
            az = abs(z)
            if az > out[j, 0]:
                out[j, 0] = az
            out[j, 1] += z * z
            out[j, 2] += az
            out[j, 3] += zb
            out[j, 8] += sg * zb
            if az > frac_k:
                out[j, 4] += 1.0
            rs2[j] += z * z
            rd[j] += bj
            rss[j] += s * s
        if (i + 1) % rowlen == 0:
            for j in range(2):
                ms = rs2[j] / rowlen
                if ms > out[j, 5]:
                    out[j, 5] = ms
                out[j, 6] += np.sqrt(ms)
                num = abs(rd[j])
                t = 0.0 if num == 0.0 else num / np.sqrt(rss[j])
                if t > out[j, 7]:
                    out[j, 7] = t
                rs2[j] = 0.0
                rd[j] = 0.0
                rss[j] = 0.0
    return out, bad


def test_operator_kernel_equals_its_reference():
    ref = numba.njit(error_model="numpy")(_op_kernel_reference)
    rng = np.random.default_rng(6)
    for trial in range(120):
        n = int(rng.integers(0, 260))
        rowlen = int(rng.integers(1, 40)) if trial % 3 else max(1, n)
        e = rng.standard_normal(n) * np.exp(rng.uniform(-5, 5, n))
        a = e + rng.standard_normal(n) * 1e-3 * np.abs(e)
        m = np.abs(e) + rng.uniform(0, 2, n)
        if trial % 4 == 0 and n:
            k = rng.integers(n, size=3)
            a[k[0]], a[k[1]] = np.nan, np.inf
            e[k[2]] = np.nan if trial % 8 else np.inf
        rn = rounded_reference(e, "float16")  # the kernel rounds the reference itself
        a16 = a.astype(np.float16)
        p, emin, mx = fused.round_params("float16")
        for use_m in (True, False):
            coef = (2.0 ** -11, 3e-4, 2.0 ** -14, 6e-8, 3.0, rowlen)
            o1, b1 = ref(a, e, rn, m, use_m, *coef)
            o2, b2, _ = fused._op_kernel(a, fused._NO_LUT, False, e, m, use_m, p, emin, mx, *coef, np.inf)
            np.testing.assert_array_equal(o2, o1)
            np.testing.assert_array_equal(b2, b1)
            # a float16 output read through its bit patterns: the statistics of its float64 values
            o3, b3, _ = fused._op_kernel(a16.view(np.uint16), fused.decode_table(np.float16), True, e, m, use_m,
                                         p, emin, mx, *coef, np.inf)
            o4, b4 = ref(a16.astype(np.float64), e, rn, m, use_m, *coef)
            np.testing.assert_array_equal(o3, o4)
            np.testing.assert_array_equal(b3, b4)


def test_plans_are_cached_per_entry_and_table(tables):
    dtype, tabs = tables
    table = tabs["auto"]
    ent = table.entry("sum", dtype, "cpu")
    assert plan_of(ent) is plan_of(ent)
    assert plan_of(ent).mode == "scale" and plan_of(tabs["operator"].entry("sum", dtype, "cpu")).mode is None


@numba.njit
def _round_all(x, p, emin, mx):  # pragma: no cover - numba
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = fused._round_ref(x[i], p, emin, mx)
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"])
def test_the_kernel_rounds_the_reference_as_rounded_reference(dtype):
    """The operator pass rounds each reference element itself (bit operations, no float64
    copy): the same value as :func:`tolstat.measure.noise.rounded_reference`, on every
    value of the format, every midpoint between neighbours (ties, both signs) and its
    neighbours, subnormals, values beyond the range and non-finite ones."""
    td = target_dtype(dtype)
    rng = np.random.default_rng(8)
    x = rounding_probe_values(td, rng)
    got = _round_all(x, *fused.round_params(dtype))
    ref = rounded_reference(x, dtype)
    same = ((got == ref) & (np.signbit(got) == np.signbit(ref))) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), (x[~same][:5], got[~same][:5], ref[~same][:5])
