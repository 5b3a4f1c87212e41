"""Boundaries of every comparison that decides pass/fail, a method or a rank.

Convention (documented in ``docs/selection.md``): a check **passes when statistic <=
threshold**; a threshold of 0 (all calibration runs exact) passes only an exact output.
Each test pins one side of one comparison, so that flipping ``<=`` to ``<`` (or ``>=`` to
``>``), an off-by-one in a minimum n, a sign, or a floor is caught.
"""

from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np
import pytest
from scipy import stats

import tolstat
from tolstat.measure import metrics
from tolstat.checks.checking import check
from tolstat.models.estimators import conformal_min_n, conformal_rank, order_statistic_min_n
from tolstat.calibration.bounds import TailOptions
from tolstat.calibration.selection import calibrate, select
from tolstat.calibration.bounds import Calibration, exceedance_probability
from tolstat.calibration.table import load_table

from table_helpers import group as _group, table as _table  # noqa: E402


# --------------------------------------------------------------------------- check: <= threshold passes
@pytest.mark.parametrize("delta", [0.5, 0.1, 3.0e-3])
def test_statistic_equal_to_threshold_passes_next_float_fails(delta):
    exp = np.array([1.0, -2.0, 0.25])
    at = exp.copy()
    at[1] = exp[1] + delta
    thr = abs(at[1] - exp[1])  # the threshold is exactly the statistic of this output
    t = _table([_group("op", "float64", "*", thr)])
    r = check(at, exp, op="op", dtype="float64", table=t)
    assert r.passed and r.failed == () and r.ratios["max_abs"] == 1.0 and r.n_exceeding == 0
    over = at.copy()
    over[1] = np.nextafter(at[1], np.inf)
    r2 = check(over, exp, op="op", dtype="float64", table=t)
    assert not r2.passed and r2.failed == ("max_abs",) and r2.n_exceeding == 1 and r2.ratios["max_abs"] > 1


def test_max_ulp_threshold_boundary():
    t = _table([_group("op", "float16", "*", 3.0, statistic="max_ulp")], statistic="max_ulp")
    exp = np.array([1.0, 2.0, -4.0])
    at = exp.astype(np.float16)
    at[2] = -4.0 - 3 * 2.0**-8  # 3 fp16 ulps (spacing 2**-8 at 4) farther from zero
    assert check(at, exp, op="op", dtype="float16", table=t).passed
    at[2] = -4.0 - 4 * 2.0**-8
    r = check(at, exp, op="op", dtype="float16", table=t)
    assert not r.passed and r.statistics["max_ulp"] == 4.0 and r.n_exceeding == 1


def test_max_rel_threshold_boundary():
    t = _table([_group("op", "float64", "*", 0.25, statistic="max_rel")], statistic="max_rel")
    exp = np.array([4.0, -8.0])
    assert check(np.array([5.0, -8.0]), exp, op="op", dtype="float64", table=t).passed  # rel = 0.25
    r = check(np.array([5.0, -10.5]), exp, op="op", dtype="float64", table=t)  # rel = 0.3125
    assert not r.passed and r.worst_index == (1,) and r.worst_allowed == 0.25 * 8.0


def test_exact_runs_give_threshold_zero_and_exact_output_passes():
    """400 exact runs: threshold 0, stated in the reason; exact output passes, 1 ulp fails."""
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(400):
        v = rng.standard_normal(16).astype(np.float16)
        pairs.append((v, v.astype(np.float64)))
    ds = tolstat.from_pairs(pairs, op="copy", dtype="float16", hardware="cpu")
    t = select(ds, form=None, fp_budget=0.01)
    st = t.entry("copy", "float16").statistics["max_abs"]
    assert st.threshold == 0.0 and st.method == "order_statistic"
    assert "400 calibration units >= 299" in st.reason
    v = rng.standard_normal(16).astype(np.float16)
    r = check(v, v.astype(np.float64), op="copy", dtype="float16", table=t)
    assert r.passed and r.ratios["max_abs"] == 0.0 and r.statistics["max_abs"] == 0.0
    w = v.copy()
    w[3] = np.nextafter(w[3], np.float16(np.inf))
    r2 = check(w, v.astype(np.float64), op="copy", dtype="float16", table=t)
    assert not r2.passed and r2.ratios["max_abs"] == math.inf


# --------------------------------------------------------------------------- calibrate: minimum n
@pytest.mark.parametrize("a,g", [(0.01, 0.95), (0.05, 0.95), (0.02, 0.9)])
def test_calibrate_at_exactly_the_minimum_runs(a, g):
    nmin = order_statistic_min_n(1 - a, g)
    # brute force: the smallest n whose maximum has confidence 1 - (1-a)^n >= g
    assert nmin == next(n for n in range(1, 10**5) if 1 - (1 - a) ** n >= g)
    x = np.random.default_rng(nmin).exponential(size=nmin)
    c = calibrate(x, a, g)
    assert c.method == "order_statistic" and c.threshold == x.max() and c.n == nmin
    assert f"n = {nmin} >= {nmin} runs needed" in c.reason and f"{nmin}-th smallest of {nmin}" in c.reason
    with pytest.raises(ValueError, match=rf"needs n >= {nmin} runs .*have n = {nmin - 1}$"):
        calibrate(x[:-1], a, g, method="order_statistic")


def test_min_n_and_ranks_against_brute_force():
    for p in (0.5, 0.9, 0.95, 0.99, 0.999):
        for g in (0.5, 0.9, 0.95, 0.99):
            want = next(n for n in range(1, 10**5) if 1 - p**n >= g)
            assert order_statistic_min_n(p, g) == want, (p, g)
    for alpha in (0.5, 0.2, 0.1, 0.05, 0.01, 0.003):
        want = next(n for n in range(1, 10**5) if math.ceil((n + 1) * (1 - alpha) - 1e-9) <= n)
        assert conformal_min_n(alpha) == want, alpha
        np.testing.assert_array_equal(conformal_rank([want, 1000], alpha),
                                      [math.ceil((want + 1) * (1 - alpha) - 1e-9),
                                       math.ceil(1001 * (1 - alpha) - 1e-9)])
        with pytest.raises(ValueError, match=f"need n >= {want}"):
            conformal_rank(want - 1, alpha)


def test_conformal_calibration_rank():
    x = np.random.default_rng(4).exponential(size=99)
    c = calibrate(x, 0.01, method="conformal")
    assert c.method == "conformal" and c.threshold == x.max()  # ceil(100 * 0.99) = 99
    c2 = calibrate(np.arange(199.0), 0.01, method="conformal")
    assert c2.threshold == 197.0  # ceil(200 * 0.99) = 198-th smallest
    with pytest.raises(ValueError, match="need n >= 99"):
        calibrate(x[:98], 0.01, method="conformal")


def test_tail_model_min_runs_and_extrapolation_boundaries():
    x = np.random.default_rng(1).exponential(size=100)
    # n == min_tail_runs is enough, one more required is not
    assert calibrate(x, 1e-3, method="evt", tail=TailOptions(min_tail_runs=100)).method == "evt"
    with pytest.raises(ValueError, match="n = 100 < 101 runs required for a tail model"):
        calibrate(x, 1e-3, method="evt", tail=TailOptions(min_tail_runs=101))
    # 1/(budget*n) = 1/(1e-3 * 100) = 10 exactly in float64: allowed at max_extrapolation = 10,
    # refused just below
    assert calibrate(x, 1e-3, method="evt", tail=TailOptions(max_extrapolation=10.0)).method == "evt"
    with pytest.raises(ValueError, match="lies 10x beyond the data"):
        calibrate(x, 1e-3, method="evt", tail=TailOptions(max_extrapolation=9.999))


def test_tail_threshold_is_floored_at_the_sample_maximum():
    """A tail bound inside the data (here the bootstrap percentile bound) is raised to the
    sample maximum: the threshold never passes a run the calibration data contradicts."""
    from tolstat.models.estimators import bootstrap_return_level_bound

    x = np.random.default_rng(0).exponential(size=60)
    c = calibrate(x, 0.04, 0.95, method="evt", tail=TailOptions(bound="bootstrap", n_resamples=300))
    raw = bootstrap_return_level_bound(x, 0.04, confidence=0.95, n_resamples=300, method="percentile",
                                       resampling="parametric", seed=0)
    assert c.method == "evt" and raw.bound < x.max()
    assert c.threshold == x.max()
    # and a bound beyond the data is kept as is
    c2 = calibrate(x, 0.04, 0.95, method="evt")
    assert c2.threshold > x.max()


# --------------------------------------------------------------------------- exceedance_probability
def _pair(e) -> tuple[float, str]:
    return e.probability, e.note


def _cal(top, n, tail=None):
    t = {"u": math.nan, "sigma": math.nan, "xi": math.nan, "zeta": math.nan}
    t.update(tail or {})
    return Calibration(threshold=1.0, estimate=1.0, budget=0.01, confidence=0.95, method="evt", reason="",
                       n=n, tail=t, top=np.sort(np.asarray(top, dtype=float))[::-1])


def test_exceedance_probability_empirical_exact():
    cal = _cal([5.0, 4.0, 3.0, 3.0, 1.0], 5)
    for v, want in [(5.0, 1 / 5), (4.5, 1 / 5), (4.0, 2 / 5), (3.0, 4 / 5), (2.0, 4 / 5), (1.0, 1.0),
                    (0.0, 1.0)]:
        e = exceedance_probability(v, cal)
        p, note = e.probability, e.note
        assert p == want, (v, p, want)
        assert note.startswith("empirical: ")
    # only the top 3 of 1000 scores kept: at the smallest kept score, exactly 3/1000; below it,
    # "more than 3 of 1000"
    cal = _cal([9.0, 8.0, 7.0], 1000)
    assert _pair(exceedance_probability(7.0, cal)) == (0.003, "empirical: 3 of 1000 calibration runs reached this value")
    e = exceedance_probability(6.9, cal)
    p, note = e.probability, e.note
    assert p == 0.003 and note.startswith("empirical: more than 3 of 1000")


@pytest.mark.parametrize("xi", [0.0, 0.5, -0.25])
def test_exceedance_probability_gpd_tail_closed_form(xi):
    u, s, z, n = 1.0, 2.0, 0.1, 500
    cal = _cal(np.linspace(0.5, 3.0, 50), n, {"u": u, "sigma": s, "xi": xi, "zeta": z})
    for v in (3.5, 4.0, 6.0):
        y = v - u
        want = z * math.exp(-y / s) if xi == 0 else z * (1 + xi * y / s) ** (-1 / xi)
        e = exceedance_probability(v, cal)
        p, note = e.probability, e.note
        assert p == pytest.approx(want, rel=1e-12), (v, p, want)
        # and the same as scipy's GPD survival function times the exceedance rate
        assert p == pytest.approx(z * stats.genpareto.sf(y, xi, 0, s), rel=1e-10)
        assert "GPD tail extrapolation" in note and "largest of 500 calibration scores is 3" in note


def test_exceedance_probability_endpoint_no_tail_and_nonfinite():
    cal = _cal(np.linspace(0.5, 3.0, 50), 500, {"u": 1.0, "sigma": 2.0, "xi": -0.5, "zeta": 0.1})
    e = exceedance_probability(5.0 + 1e-9, cal)  # endpoint u + sigma/0.5 = 5
    p, note = e.probability, e.note
    assert p == 0.0 and "above the endpoint 5 of the fitted bounded GPD tail" in note
    p = exceedance_probability(4.0, cal).probability
    assert p == pytest.approx(0.1 * (1 - 0.5 * 3 / 2) ** 2, rel=1e-12)
    nt = _cal(np.linspace(0.5, 3.0, 50), 500)
    assert _pair(exceedance_probability(3.5, nt)) == (1 / 501, "beyond the data (the largest of 500 calibration "
                                                        "scores is 3); no tail model: probability < 1/(n+1)")
    # a value beyond the data but not above the tail threshold u: no extrapolation either
    hi_u = _cal(np.linspace(0.5, 3.0, 50), 500, {"u": 10.0, "sigma": 2.0, "xi": 0.0, "zeta": 0.1})
    assert exceedance_probability(3.5, hi_u).probability == 1 / 501
    for v in (math.inf, math.nan):
        e = exceedance_probability(v, nt)
        p, note = e.probability, e.note
        assert p == 0.0 and note.startswith("non-finite output")


# --------------------------------------------------------------------------- tables
def test_duplicate_groups_are_rejected():
    with pytest.raises(ValueError, match=r"duplicate \(op, dtype, hardware\) groups"):
        _table([_group("a", "float16", "cpu", 1.0), _group("a", "float16", "cpu", 2.0)])
    # same op and dtype on two hardware is not a duplicate
    assert len(_table([_group("a", "float16", "cpu", 1.0), _group("a", "float16", "gpu", 2.0)])) == 2


def test_table_json_is_written_atomically(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    old = _table([_group("a", "float16", "cpu", 1.0)])
    old.to_json(p)
    before = p.read_bytes()
    new = _table([_group("a", "float16", "cpu", 2.0)])

    def boom(src, dst):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        new.to_json(p)
    monkeypatch.undo()
    assert p.read_bytes() == before  # the old table is intact
    assert load_table(p).entry("a", "float16", "cpu").statistics["max_abs"].threshold == 1.0
    new.to_json(p)
    assert json.loads(p.read_text())["groups"][0]["statistics"]["max_abs"]["threshold"] == 2.0


def test_lookup_order_exact_before_star_before_default_op():
    t = _table([
        _group("mm", "float16", "gpuA", 1.0),
        _group("mm", "float16", "*", 2.0),
        _group("mm", "float16", "gpuB", 3.0),
        _group("*", "float16", "gpuA", 4.0),
        _group("*", "float16", "*", 5.0),
        _group("sm", "float16", "gpuC", 6.0),
    ])

    def thr(op, hw):
        e = t.entry(op, "float16", hw)
        return e.statistics["max_abs"].threshold, e.hardware, e.fallback

    assert thr("mm", "gpuA") == (1.0, "gpuA", "exact")
    assert thr("mm", "gpuB") == (3.0, "gpuB", "exact")
    assert thr("mm", "gpuZ") == (2.0, "*", "any hardware")
    assert thr("mm", None) == (2.0, "*", "any hardware")  # '*' beats "several hardware"
    assert thr("sm", None) == (6.0, "gpuC", "only hardware")
    assert thr("sm", "gpuA") == (4.0, "gpuA", "default op, exact")  # op's own hardware missing
    assert thr("xx", "gpuA") == (4.0, "gpuA", "default op, exact")
    assert thr("xx", "gpuZ") == (5.0, "*", "default op, any hardware")
    with pytest.raises(KeyError, match="no tolerance for op='mm', dtype='float32'"):
        t.entry("mm", "float32", "gpuA")
    t2 = _table([_group("mm", "float16", "gpuA", 1.0), _group("mm", "float16", "gpuB", 3.0)])
    with pytest.raises(KeyError, match=r"several hardware \['gpuA', 'gpuB'\]"):
        t2.entry("mm", "float16")


# --------------------------------------------------------------------------- validate
def _ds():
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal(8).astype(np.float16), rng.standard_normal(8)) for _ in range(3)]
    return tolstat.from_pairs(pairs, op="a", dtype="float16", hardware="cpu", options=tolstat.CollectOptions(labels={"variant": "x"}, sample_size=4))


def test_validate_sample_range():
    ds = _ds()
    tolstat.dataset.validate(ds)
    ok = ds.copy(deep=True)
    ok["n_sample"].values[0] = ds.sizes["sample"]  # == sample: allowed
    ok["n_elements"].values[0] = ds.sizes["sample"]
    tolstat.dataset.validate(ok)
    for bad_value in (ds.sizes["sample"] + 1, -1):
        bad = ds.copy(deep=True)
        bad["n_sample"].values[1] = bad_value
        with pytest.raises(ValueError, match=r"'n_sample' out of range \[0, sample\]"):
            tolstat.dataset.validate(bad)
    bad = ds.copy(deep=True)
    bad["n_elements"].values[2] = int(bad["n_sample"].values[2]) - 1
    with pytest.raises(ValueError, match="'n_sample' exceeds 'n_elements'"):
        tolstat.dataset.validate(bad)
    bad = ds.copy(deep=True)
    bad["sample_abs"].values[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN inside the valid samples"):
        tolstat.dataset.validate(bad)


def test_validate_label_and_covariate_mismatch():
    ds = _ds()
    with pytest.raises(ValueError, match=r"label 'variant' listed in attrs\['labels'\] is missing"):
        tolstat.dataset.validate(ds.drop_vars("variant"))
    bad = ds.copy()
    bad.attrs["labels"] = "variant,nope"
    with pytest.raises(ValueError, match=r"label 'nope' listed in attrs\['labels'\]"):
        tolstat.dataset.validate(bad)
    bad = ds.copy()
    bad.attrs["covariates"] = ",".join([x for x in [ds.attrs.get("covariates", "")] if x] + ["K"])
    with pytest.raises(ValueError, match=r"covariate 'K' listed in attrs\['covariates'\] is missing"):
        tolstat.dataset.validate(bad)


# --------------------------------------------------------------------------- ULP ordered integers
def _all_finite(np_dtype, uint_dtype, bits):
    v = np.arange(2**bits, dtype=np.uint64).astype(uint_dtype).view(np_dtype)
    with np.errstate(invalid="ignore"):
        f = v.astype(np.float64)
    return v[np.isfinite(f)], f[np.isfinite(f)]


@pytest.mark.parametrize("name,np_dtype,uint_dtype,bits", [
    ("float16", np.float16, np.uint16, 16),
    ("bfloat16", ml_dtypes.bfloat16, np.uint16, 16),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, np.uint8, 8),
    ("float8_e5m2", ml_dtypes.float8_e5m2, np.uint8, 8),
])
def test_ordered_int_is_the_rank_among_all_values(name, np_dtype, uint_dtype, bits):
    """Enumerate every finite value: ordered_int = (rank among the distinct values) - (rank
    of 0), for negatives as for positives; -0 and +0 map to 0."""
    vals, f = _all_finite(np_dtype, uint_dtype, bits)
    distinct = np.unique(f)  # sorted; -0 == +0 collapse
    want = np.searchsorted(distinct, f) - np.searchsorted(distinct, 0.0)
    got = metrics.ordered_int(vals, name)
    assert (f < 0).sum() > 100 and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # the input's shape is kept
    assert metrics.ordered_int(vals[:12].reshape(3, 4), name).shape == (3, 4)
    np.testing.assert_array_equal(metrics.ordered_int(vals[:12].reshape(3, 4), name), want[:12].reshape(3, 4))


def test_ordered_int_negative_float32_by_nextafter():
    rng = np.random.default_rng(9)
    x = -np.abs(rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000)).astype(np.float32)
    x = np.r_[x, -np.finfo(np.float32).smallest_subnormal, np.float32(-0.0)].astype(np.float32)
    i = metrics.ordered_int(x, "float32")
    down = np.nextafter(x, np.float32(-np.inf))
    up = np.nextafter(x, np.float32(np.inf))
    np.testing.assert_array_equal(metrics.ordered_int(down, "float32"), i - 1)
    # -0 -> +smallest subnormal is one step above 0, so compare away from the zero crossing
    keep = x < 0
    np.testing.assert_array_equal(metrics.ordered_int(up[keep], "float32"), i[keep] + 1)
    assert metrics.ordered_int(np.float32([-0.0, 0.0]), "float32").tolist() == [0, 0]


# --------------------------------------------------------------------------- Calibration fields
def _expect_common(c, x, a, g, method):
    from tolstat.calibration.bounds import tail_fit

    assert (c.budget, c.confidence, c.method, c.n) == (a, g, method, x.size)
    np.testing.assert_array_equal(c.top, np.sort(x)[::-1][:256])
    want_tail = tail_fit(x, 0.1, 30).tail
    assert c.tail.keys() == want_tail.keys()
    for k, v in want_tail.items():
        assert c.tail[k] == v or (math.isnan(c.tail[k]) and math.isnan(v)), k


def test_calibration_records_every_field():
    """Each method's Calibration: threshold, point estimate, budget, confidence, method,
    reason, n, tail fit and the top scores, against values computed here."""
    rng = np.random.default_rng(12)
    x = rng.exponential(size=400)
    xs = np.sort(x)
    c = calibrate(x, 0.01, 0.95)
    _expect_common(c, x, 0.01, 0.95, "order_statistic")
    assert c.estimate == np.quantile(x, 0.99, method="higher") and c.threshold == xs[-1]
    assert c.reason == ("order statistic: n = 400 >= 299 runs needed for the 0.99-quantile at 0.95 confidence; "
                        "threshold = 400-th smallest of 400 scores")
    c = calibrate(x, 0.01, 0.9, method="conformal")
    _expect_common(c, x, 0.01, 0.9, "conformal")
    assert c.threshold == xs[int(np.ceil(401 * 0.99)) - 1] and c.estimate == np.quantile(x, 0.99, method="higher")
    assert c.reason == ("split conformal: 397-th smallest of 400 scores; marginal guarantee P(new score > "
                        "threshold) <= budget averaged over calibration sets (no confidence level)")
    c = calibrate(x, 1e-3, 0.95, method="evt")
    _expect_common(c, x, 1e-3, 0.95, "evt")
    t = c.tail
    rl = t["u"] + t["sigma"] / t["xi"] * ((t["zeta"] / 1e-3) ** t["xi"] - 1)
    assert c.estimate == pytest.approx(rl, rel=1e-10) and c.threshold > c.estimate
    k = int(round(t["zeta"] * 400))
    assert c.reason.startswith(f"evt (model-based, no finite-sample guarantee): n = 400 < 2995 runs for the order statistic; GPD tail over the top {k} of "
                               f"400 scores (xi = {t['xi']:.3g}, KS p = {t['gof_p']:.2g}); threshold = ")
    assert c.reason.endswith(f"(point estimate {rl:.6g}), extrapolating 2.5x beyond the data")


def test_conformal_threshold_direct_message():
    from tolstat.calibration.bounds import conformal_threshold

    x = np.arange(98.0)
    with pytest.raises(ValueError, match=r"^n = 98 runs are too few for a split-conformal bound at budget 0.01: "
                                         r"need n >= 99$"):
        conformal_threshold(x, 0.01, 0.95, {}, x[::-1])


@pytest.mark.parametrize("dist", ["exponential", "lognormal", "beta"])
def test_conservative_tail_bound_is_the_documented_formula(dist):
    """evt threshold = max(sample max, return level at upper bounds of the shape and the
    scale): xi_u = max(xi, 0) + z (1 + max(xi, 0)) / sqrt(k), sigma_u = s0 2k / chi2_{1-g'}(2k)
    with s0 = sigma (xi > 0) or the mean excess (xi <= 0), g' = 1 - (1 - g)/2, z = Phi^-1(g'),
    k the exceedances of u. Computed here with scipy from the fitted (u, sigma, xi, zeta)."""
    rng = np.random.default_rng(5)
    x = {"exponential": rng.exponential(size=600), "lognormal": rng.lognormal(0.0, 0.6, 600),
         "beta": rng.beta(2.0, 5.0, 600)}[dist]
    a, g = 1e-3, 0.9
    c = calibrate(x, a, g, method="evt")
    assert c.method == "evt"
    u, sigma, xi, zeta = (c.tail[k] for k in ("u", "sigma", "xi", "zeta"))
    y = np.sort(x)[np.sort(x) > u] - u
    k = y.size
    g2 = 1 - (1 - g) / 2
    z = stats.norm.ppf(g2)
    xi0 = max(xi, 0.0)
    s0 = sigma if xi > 0 else float(np.mean(y))
    xi_u = xi0 + z * (1 + xi0) / math.sqrt(k)
    s_u = s0 * 2 * k / stats.chi2.ppf(1 - g2, 2 * k)
    rl = u + s_u / xi_u * ((zeta / a) ** xi_u - 1)
    assert c.threshold == pytest.approx(max(rl, x.max()), rel=1e-9)
    assert c.threshold == pytest.approx(u + stats.genpareto.isf(a / zeta, xi_u, 0, s_u), rel=1e-9)
    assert (xi > 0) == (dist == "lognormal")  # both branches of the scale are exercised


def test_tail_threshold_direct_message():
    from tolstat.calibration.bounds import TailOptions, tail_fit, tail_threshold

    x = np.random.default_rng(1).exponential(size=40)
    with pytest.raises(ValueError, match=r"^the order statistic needs n >= 2995 runs for budget 0.001 at confidence "
                                         r"0.95 .*have n = 40; the tail model was refused: n = 40 < 50 runs required"):
        tail_threshold(x, 1e-3, 0.95, tail_fit(x, 0.1, 30), np.sort(x)[::-1], TailOptions())


def test_tail_threshold_estimate_and_bootstrap_settings():
    """The point estimate is the GPD return level below the tail rate zeta and the empirical
    quantile at or above it; the bootstrap bound is computed with the options given."""
    from tolstat.calibration.bounds import TailOptions, tail_fit, tail_threshold
    from tolstat.models.estimators import bootstrap_return_level_bound

    x = np.random.default_rng(8).exponential(size=400)
    fit = tail_fit(x, 0.1, 30)
    assert fit.why_not == "" and fit.tail["zeta"] == 0.1
    top = np.sort(x)[::-1]
    for a, p in ((0.1, 0.9),):  # a == zeta: the empirical quantile, not the return level (= u)
        c = tail_threshold(x, a, 0.95, fit, top, TailOptions())
        assert c.estimate == np.quantile(x, p, method="higher"), a
    # each configuration binds a different one of tail_fraction / min_exceedances (k = max of the two)
    for tf, me in ((0.25, 30), (0.1, 70)):
        opts = TailOptions(bound="bootstrap", n_resamples=200, tail_fraction=tf, min_exceedances=me)
        c = tail_threshold(x, 1e-3, 0.9, tail_fit(x, tf, me), top, opts, seed=7)
        kw = dict(confidence=0.9, n_resamples=200, method="percentile", resampling="parametric", seed=7,
                  tail_fraction=tf, min_exceedances=me)
        raw = bootstrap_return_level_bound(x, 1e-3, **kw)
        assert raw.bound > x.max() and c.threshold == raw.bound
        dropped = {**kw, "tail_fraction": 0.1, "min_exceedances": 30}  # an argument not passed on
        assert bootstrap_return_level_bound(x, 1e-3, **dropped).bound != c.threshold
        for other in (dict(confidence=0.95), dict(n_resamples=1000), dict(seed=0), dict(resampling="nonparametric")):
            assert bootstrap_return_level_bound(x, 1e-3, **{**kw, **other}).bound != c.threshold, other
    assert "threshold = 0.9 parametric-bootstrap percentile upper bound (200 resamples; known to under-cover " \
           "for small tails) of the return level" in c.reason


def test_split_budget_single_check_and_defaults():
    from tolstat.calibration.bounds import TailOptions, tail_fit, tail_threshold
    from tolstat._base.inference import split_budget

    assert split_budget(0.01, 1) == pytest.approx(0.01, rel=1e-15)
    assert split_budget(0.01, 1, method="bonferroni") == 0.01
    with pytest.raises(ValueError, match="n_checks must be a positive integer, got 0"):
        split_budget(0.01, 0)
    # tail_threshold's default seed is 0; the conservative bound names its upper bounds
    x = np.random.default_rng(8).exponential(size=400)
    fit, top = tail_fit(x, 0.1, 30), np.sort(x)[::-1]
    opts = TailOptions(bound="bootstrap", n_resamples=100)
    assert tail_threshold(x, 1e-3, 0.9, fit, top, opts).threshold == \
        tail_threshold(x, 1e-3, 0.9, fit, top, opts, seed=0).threshold
    c = tail_threshold(x, 1e-3, 0.9, fit, top, TailOptions())
    assert "threshold = return level at upper 0.95 bounds of the shape (xi <= " in c.reason
    assert "never assuming a bounded tail) and of the scale (sigma <= " in c.reason
