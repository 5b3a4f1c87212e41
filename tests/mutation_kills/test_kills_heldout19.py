"""Mutants that survived the held-out sample (``--sample 15 --seed 19``) of the mutation run.

Each test checks a documented behaviour that a plausible wrong implementation breaks,
against an independent reference where there is one: a closed form, numpy/scipy, the
documented definition, or the layout described in ``docs/selection.md``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import xarray as xr
from scipy import special, stats

import tolstat
from estimators_helpers import make_errors
from table_helpers import group as _group, table as _table
from tolstat.calibration.bounds import Calibration, exceedance_probability, tail_fit
from tolstat.models.estimators import fit
from tolstat.models.estimators.bootstrap import bca_level, bootstrap_quantile_bound, bootstrap_return_level_bound
from tolstat.models.estimators.evt import gev_fit_mle
from tolstat.models.estimators.orderstat import order_statistic_rank
from tolstat.models.estimators.tail import upper_quantile
from tolstat.measure.metrics import error_metrics
from tolstat.models.statistics import get as get_statistic


# ------------------------------------------------------------------ _fastcheck
def test_check_of_empty_arrays_is_refused_on_the_fast_path_too():
    t = _table([_group("op", "float32", "*", 1e-3)])  # a max_abs entry: the fast path applies
    with pytest.raises(ValueError, match="empty arrays: nothing to compare"):
        tolstat.check(np.array([], np.float32), np.array([]), op="op", dtype="float32", table=t)


# ------------------------------------------------------------------ bounds
def test_exceedance_probability_compares_in_float64_whatever_the_dtype_of_top():
    # top scores held as float32 (exact values 3, 2, 1): a value just above the score 2 was
    # reached by one run only (the score 3). Compared in float32, 2 + 2**-30 would round to 2.
    cal = Calibration(threshold=3.0, estimate=2.0, budget=0.01, confidence=0.95, method="order_statistic",
                      reason="", n=10, top=np.array([3.0, 2.0, 1.0], dtype=np.float32))
    p = exceedance_probability(2.0 + 2.0**-30, cal)
    assert p.probability == 1 / 10  # k / n with k = #{top >= value} = 1
    assert p.note == "empirical: 1 of 10 calibration runs reached this value"
    assert exceedance_probability(2.0, cal).probability == 2 / 10


def test_tail_fit_of_a_tail_heavier_than_xi_1_is_inadequate():
    # Pareto(0.7) scores: GPD shape 1/0.7 = 1.43 (infinite mean); the KS test accepts the fit
    x = np.random.default_rng(0).pareto(0.7, size=400)
    f = tail_fit(x, 0.1, 30)
    u = np.sort(x)[-41]  # the threshold: max(30, ceil(0.1 * 400)) = 40 exceedances
    assert f.tail["u"] == u
    xi_scipy, _, _ = stats.genpareto.fit(np.sort(x)[-40:] - u, floc=0.0)  # independent MLE
    assert xi_scipy > 1 and f.tail["xi"] == pytest.approx(xi_scipy, abs=0.05)
    assert f.tail["gof_p"] >= 0.05
    assert f.why_not == f"tail too heavy (xi = {f.tail['xi']:.3g} >= 1: infinite mean)"
    with pytest.raises(tolstat.NotEnoughData, match=r"tail too heavy \(xi = 1\.59 >= 1: infinite mean\)"):
        tolstat.calibration.calibrate(x, budget=1e-3, method="evt")


# ------------------------------------------------------------------ checks (operator form)
def test_operator_check_ratio_of_zero_against_a_zero_threshold_is_zero():
    g = _group("softmax", "float16", "*", 0.0, statistic="op_score")
    g["certificate"] = {"form": "operator", "method": "order_statistic", "rowwise": True,
                        "normalisers": {"op_max": 4.0, "op_rms": 2.0}, "covariates": [],
                        "needs_magnitude": False, "guarantee": "PAC: test"}
    t = _table([g], statistic="op_score")
    e = np.array([[0.25, 0.5, 0.125, 0.125]])  # exactly representable in float16
    r = tolstat.check(e.astype(np.float16), e, op="softmax", dtype="float16", table=t, magnitude="ref")
    assert r.passed and r.statistics == {"op_score": 0.0, "op_max": 0.0, "op_rms": 0.0}
    assert r.ratios == {"op_score": 0.0, "op_max": 0.0, "op_rms": 0.0}  # 0 / 0 is "at no fraction"
    bad = e.astype(np.float16)
    bad[0, 0] = np.float16(0.375)
    r = tolstat.check(bad, e, op="softmax", dtype="float16", table=t, magnitude="ref")
    assert not r.passed and r.ratios["op_score"] == math.inf


# ------------------------------------------------------------------ estimators._apply
def test_gev_block_maxima_with_an_absent_group():
    # op a is calibrated in float32 only and op b in float16 only: (a, float16) and
    # (b, float32) are absent groups (all NaN) of the fitted grid
    rng = np.random.default_rng(7)
    x = rng.gumbel(size=40) + 5.0
    y = rng.gumbel(size=31) + 5.0
    ds = make_errors({("a", "float32", "cpu"): x, ("b", "float16", "cpu"): y})
    out = fit(ds, method="gev", block_size=2, q=0.05)
    for op, dt, v in (("a", "float32", x), ("b", "float16", y)):
        m = v.size // 2
        ref = gev_fit_mle(v[: 2 * m].reshape(m, 2).max(axis=1), q=0.05)
        assert float(out.sel(op=op, dtype=dt, hardware="cpu")["threshold"]) == pytest.approx(
            ref["return_level"], rel=1e-9)
    for op, dt in (("a", "float16"), ("b", "float32")):
        assert np.isnan(float(out.sel(op=op, dtype=dt, hardware="cpu")["threshold"]))


@pytest.mark.parametrize("qm", ["lower", "higher", "nearest"])
def test_bootstrap_fit_passes_its_quantile_method(qm):
    x = np.random.default_rng(8).exponential(size=100)  # (n - 1) p = 89.1: the methods differ
    ds = make_errors({("a", "float32", "cpu"): x})
    assert len({float(np.quantile(x, 0.9, method=m)) for m in ("linear", "lower", "higher")}) == 3
    out = fit(ds, method="bootstrap", p=0.9, quantile_method=qm, n_resamples=200, seed=3)
    assert float(out["estimate"].item()) == np.quantile(x, 0.9, method=qm)
    ref = bootstrap_quantile_bound(x, 0.9, n_resamples=200, seed=3, quantile_method=qm)
    assert float(out["threshold"].item()) == ref.bound


# ------------------------------------------------------------------ estimators.bootstrap
def test_bca_level_without_jackknife_spread_has_zero_acceleration():
    # equal jackknife values: acceleration 0, so BCa reduces to the bias-corrected
    # percentile level Phi(2 z0 + z_gamma), z0 = Phi^-1(mid-rank share of theta_b below theta_hat)
    tb = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    level, z0, a = bca_level(tb, 2.0, np.full(5, 3.0), 0.9)
    prop = (1 + 3) / (2 * 8)  # #(tb < 2) = 1, #(tb <= 2) = 3
    assert a == 0.0
    assert z0 == pytest.approx(special.ndtri(prop), rel=1e-15)
    assert level == pytest.approx(stats.norm.cdf(2 * stats.norm.ppf(prop) + stats.norm.ppf(0.9)), rel=1e-12)


def test_return_level_bound_with_a_single_exceedance_is_the_estimate():
    # 99 runs at 1 and one at 5: the 30 largest have one value above u = 1, so the GPD has one
    # exceedance (sigma = 4, xi = -1: uniform on (0, 4]) and nothing to resample. The return
    # level at q = 1e-3 < zeta = 1/100: u + sigma / xi * ((zeta / q)**xi - 1) = 1 + 4 * 0.9
    x = np.array([1.0] * 99 + [5.0])
    r = bootstrap_return_level_bound(x, 1e-3, n_resamples=200)
    assert r.estimate == pytest.approx(4.6, rel=1e-15)
    assert r.bound == r.estimate
    assert math.isnan(r.standard_error)


# ------------------------------------------------------------------ estimators.orderstat
def _rank_reference(n, p, g):
    """The documented definition: the smallest r with binom.cdf(r - 1, n, p) >= g."""
    r = 1
    while stats.binom.cdf(r - 1, n, p) < g:
        r += 1
    return r


@pytest.mark.parametrize("off", [1, 2])
def test_order_statistic_rank_guard_corrects_a_ppf_that_is_too_high(monkeypatch, off):
    # the guard enforces cdf(k) >= g > cdf(k - 1) when scipy's ppf is off by rounding; here
    # a ppf that is `off` too high, down to a correct k of 0 (rank 1: the smallest value)
    cases = [(5, 0.01, 0.95), (10, 0.001, 0.99), (400, 0.99, 0.95), (60, 0.9, 0.5)]
    want = [_rank_reference(n, p, g) for n, p, g in cases]
    assert want[:2] == [1, 1]
    ppf = stats.binom.ppf
    monkeypatch.setattr(stats.binom, "ppf", lambda q, n, p: ppf(q, n, p) + off)
    got = [int(order_statistic_rank(n, p, g)[0]) for n, p, g in cases]
    assert got == want


# ------------------------------------------------------------------ estimators.tail
def test_upper_quantile_of_a_topk_array_without_n_coordinate():
    rng = np.random.default_rng(9)
    x = [rng.exponential(size=200), rng.exponential(size=150)]
    k = 8
    top = np.stack([np.sort(v)[::-1][:k] for v in x])
    da = xr.DataArray(top, dims=("group", "rank"), coords={"group": ["a", "b"]})  # no 'n'
    got = upper_quantile(da, n=[200, 150], p=0.99, method="higher")
    np.testing.assert_array_equal(got.values, [np.quantile(v, 0.99, method="higher") for v in x])
    assert got.coords["n"].values.tolist() == [200, 150]


# ------------------------------------------------------------------ selection
def test_select_provenance_records_the_budget_split():
    rng = np.random.default_rng(10)
    pairs = [(e.astype(np.float32), e) for e in rng.standard_normal((160, 16))]  # n >= 146 for a = 0.025
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32", progress=False)
    t = tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"], budget_split="bonferroni")
    settings = t.meta["provenance"]["settings"]
    assert settings["budget_split"] == "bonferroni" and t.meta["budget_split"] == "bonferroni"
    assert settings["fp_budget"] == 0.05 and settings["statistic"] == ["max_abs", "bias"]
    ent = t.entry("add", "float32")
    assert [ent.statistics[s].budget for s in ("max_abs", "bias")] == [0.05 / 2, 0.05 / 2]


# ------------------------------------------------------------------ statistics
class _ZeroScaleAt1:
    """A user scale model (ScaleLike) whose scale is 0 at the second element."""

    def scale(self, ref_abs, cov=None, dtype=None):
        s = np.ones_like(np.asarray(ref_abs, dtype=np.float64))
        s[1] = 0.0
        return s


def test_max_score_of_an_exact_element_with_zero_scale_is_zero_without_a_warning():
    m = error_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.5]))  # element 1 exact: 0 / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 'invalid value' RuntimeWarning
        elem = get_statistic("max_score").elements(m, _ZeroScaleAt1(), {}, "float64")
    np.testing.assert_array_equal(elem, [0.0, 0.0, 0.5])


# ------------------------------------------------------------------ table
@pytest.mark.parametrize(("linear", "match"), [
    ({"K": "nan"}, r"scale linear\['K'\] must be finite, got 'nan'"),
    ({"K": "inf"}, r"scale linear\['K'\] must be finite, got 'inf'"),
    ({"K": "x"}, r"scale linear\['K'\]: expected a number, got 'x'"),
    ({"K": True}, r"scale linear\['K'\]: expected a number, got True \(bool\)"),
])
def test_scale_linear_coefficients_are_validated(linear, match):
    g = _group("op", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = {"form": "allclose", "atol": 0.5, "rtol": 0.25, "linear": linear}
    with pytest.raises(ValueError, match=match):
        _table([g], statistic="max_score")


def test_table_variables_have_the_documented_dimensions():
    # docs/selection.md: dims group, statistic, rank; per (group, statistic): threshold,
    # estimate, budget, stat_confidence, method, reason, tail_*; per group: n, scale_*
    g1 = _group("op", "float32", "*", 3.0, top=(3.0, 2.0), tail={"u": 1.0, "sigma": 0.5, "xi": 0.1,
                                                                 "zeta": 0.1, "gof_p": 0.5})
    g2 = _group("op2", "float16", "*", 1.0)
    t = _table([g1, g2])
    d = t.data
    per_stat = ["threshold", "estimate", "budget", "stat_confidence", "method", "reason",
                "tail_u", "tail_sigma", "tail_xi", "tail_zeta", "tail_gof_p"]
    per_group = ["n", "n_inexact", "scale_atol", "scale_rtol", "scale_json", "certificate_json"]
    assert {v: d[v].dims for v in per_stat} == {v: ("group", "statistic") for v in per_stat}
    assert {v: d[v].dims for v in per_group} == {v: ("group",) for v in per_group}
    assert d["top_scores"].dims == ("group", "statistic", "rank")
    assert set(d.dims) == {"group", "statistic", "rank"}
    assert d["reason"].values.tolist() == [["test"], ["test"]]


def test_table_scale_columns_default_to_zero_for_missing_coefficients():
    g = _group("op", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = {"form": "allclose", "rtol": 0.25}  # no atol
    h = _group("op2", "float32", "*", 2.0, statistic="max_score")
    h["scale"] = {"form": "allclose", "atol": 0.5}  # no rtol
    t = _table([g, h], statistic="max_score")
    assert t.data["scale_atol"].values.tolist() == [0.0, 0.5]
    assert t.data["scale_rtol"].values.tolist() == [0.25, 0.0]
    assert t.entry("op", "float32").allclose() == (0.0, 2.0 * 0.25)


@pytest.mark.parametrize(("tops", "width"), [([(), ()], 1), ([(2.0,), ()], 1), ([(3.0, 2.0, 1.0), (1.0,)], 3)])
def test_top_scores_rank_width_is_the_longest_list(tops, width):
    t = _table([_group("op", "float32", "*", 3.0, top=tops[0]), _group("op2", "float32", "*", 3.0, top=tops[1])])
    assert t.data.sizes["rank"] == width
    for i, (op, top) in enumerate(zip(("op", "op2"), tops)):
        np.testing.assert_array_equal(t.entry(op, "float32").statistics["max_abs"].top, np.array(top))
