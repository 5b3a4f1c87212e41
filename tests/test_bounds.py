"""Tail bounds (tolstat.calibration.bounds): tail fits, the conservative GPD bound, TailOptions.

References: the closed forms in the docstrings (the conservative GPD tail bound, the GPD
return level), scipy (``kstest``, ``genpareto``, ``norm``, ``chi2``), and the stated wording of
the refusals.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import tolstat
from tolstat.calibration.bounds import Calibration, TailOptions, exceedance_probability, tail_fit
from tolstat.models.estimators.bootstrap import bootstrap_return_level_bound


def _sample(n_distinct, seed):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 1, 270)
    counts = np.full(n_distinct, 30 // n_distinct)
    counts[: 30 - counts.sum()] += 1  # 30 top runs (the exceedances), tied in n_distinct values
    top = np.repeat(1 + np.sort(rng.exponential(size=n_distinct)), counts)
    return np.concatenate([base, top])


def test_tail_fit_needs_ten_distinct_exceedances_and_accepts_ten():
    for n_distinct, seed in ((10, 1), (9, 1)):
        x = _sample(n_distinct, seed)
        f = tail_fit(x, 0.1, 30)
        xs = np.sort(x)
        nd = np.unique(xs[xs > f.tail["u"]] - f.tail["u"]).size
        assert nd == n_distinct  # the 30 top runs are the exceedances
        if nd < 10:
            assert f.why_not.startswith(f"only {nd} distinct values above the tail threshold")
        else:
            assert not f.why_not.startswith("only")
            assert np.isfinite(f.tail["gof_p"])  # it went on to the goodness-of-fit test


def _gpd_return_level(u, sigma, xi, zeta, q):
    """u + sigma/xi ((zeta/q)**xi - 1); u + sigma log(zeta/q) at xi = 0."""
    if xi == 0:
        return u + sigma * math.log(zeta / q)
    return u + sigma / xi * ((zeta / q) ** xi - 1.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_conservative_tail_bound_is_the_documented_closed_form(seed):
    # exponential and GPD(0.2) scores, budget 1e-3 at n = 600 (the order statistic needs 2995)
    rng = np.random.default_rng(seed)
    x = rng.exponential(size=600) if seed == 0 else stats.genpareto.rvs(0.2, size=600, random_state=rng)
    a, g = 1e-3, 0.9
    cal = tolstat.calibration.calibrate(x, budget=a, confidence=g, method="evt")
    t = cal.tail
    xs = np.sort(x)
    y = xs[xs > t["u"]] - t["u"]
    k = y.size
    g2 = 1.0 - (1.0 - g) / 2.0  # each of the two bounds at g' = 1 - (1 - g)/2
    xi0 = max(t["xi"], 0.0)
    sigma0 = t["sigma"] if t["xi"] > 0 else float(np.mean(y))  # mean excess: the exponential MLE
    xi_u = xi0 + stats.norm.ppf(g2) * (1.0 + xi0) / math.sqrt(k)
    sigma_u = sigma0 * 2.0 * k / stats.chi2.ppf(1.0 - g2, 2 * k)
    ref = max(_gpd_return_level(t["u"], sigma_u, xi_u, t["zeta"], a), float(x.max()))
    assert cal.method == "evt"
    assert cal.threshold == pytest.approx(ref, rel=1e-10)
    assert cal.estimate == pytest.approx(_gpd_return_level(t["u"], t["sigma"], t["xi"], t["zeta"], a), rel=1e-10)


def test_conservative_tail_bound_uses_the_fitted_scale_for_a_shape_below_one():
    # a fitted 0 < xi < 1 keeps the fitted sigma (the mean excess is only the xi <= 0 case)
    x = stats.genpareto.rvs(0.5, size=600, random_state=np.random.default_rng(3))
    cal = tolstat.calibration.calibrate(x, budget=1e-3, confidence=0.9, method="evt")
    t = cal.tail
    assert 0 < t["xi"] < 1
    k = int(np.sum(x > t["u"]))
    g2 = 0.95
    xi_u = t["xi"] + stats.norm.ppf(g2) * (1.0 + t["xi"]) / math.sqrt(k)
    sigma_u = t["sigma"] * 2.0 * k / stats.chi2.ppf(1.0 - g2, 2 * k)
    assert cal.threshold == pytest.approx(_gpd_return_level(t["u"], sigma_u, xi_u, t["zeta"], 1e-3), rel=1e-10)


def test_tail_fit_ks_p_value_is_scipy_on_the_strict_exceedances():
    x = np.random.default_rng(4).exponential(size=500)
    f = tail_fit(x, 0.1, 30)
    y = np.sort(x)[x.size - 50:] - f.tail["u"]  # the 50 values strictly above u (no ties)
    assert np.all(y > 0) and f.tail["u"] == np.sort(x)[x.size - 51]
    ref = stats.kstest(y, stats.genpareto(f.tail["xi"], 0.0, f.tail["sigma"]).cdf).pvalue
    assert f.tail["gof_p"] == pytest.approx(ref, rel=1e-12)


def test_tail_fit_with_too_few_runs_says_how_many_are_needed():
    f = tail_fit(np.arange(20.0), 0.1, 30)
    assert f.why_not == "n = 20 < 31 runs needed for a tail fit"
    assert all(math.isnan(v) for v in f.tail.values())


@pytest.mark.parametrize("g", [0.8, 0.95])
def test_bootstrap_tail_bound_passes_confidence_and_resamples(g):
    x = np.random.default_rng(5).exponential(size=600)
    opts = TailOptions(bound="bootstrap", n_resamples=300)
    cal = tolstat.calibration.calibrate(x, budget=1e-3, confidence=g, method="evt", tail=opts, seed=2)
    ref = bootstrap_return_level_bound(x, 1e-3, confidence=g, n_resamples=300, method="percentile",
                                       resampling="parametric", seed=2)
    assert cal.threshold == max(ref.bound, float(x.max()))
    assert "(300 resamples;" in cal.reason


def test_evt_refusal_names_the_order_statistic_minimum():
    x = np.random.default_rng(6).exponential(size=20)  # below min_tail_runs = 50 and 31 for a fit
    with pytest.raises(tolstat.NotEnoughData,
                       match=r"^the order statistic needs n >= 2995 runs for budget 0\.001 at confidence 0\.95 "
                             r"\(n >= ln\(1-confidence\)/ln\(1-budget\)\); have n = 20; the tail model was "
                             r"refused: n = 20 < 50 runs required for a tail model; n = 20 < 31 runs needed for a "
                             r"tail fit\. Collect at least 2995 runs, or raise fp_budget$"):
        tolstat.calibration.calibrate(x, budget=1e-3, method="evt")


def test_tail_options_provenance_uses_the_field_names():
    d = TailOptions(n_resamples=200, min_tail_runs=80, max_extrapolation=50.0, tail_fraction=0.2,
                    min_exceedances=40, bound="bootstrap").to_dict()
    assert d == {"n_resamples": 200, "min_tail_runs": 80, "max_extrapolation": 50.0, "tail_fraction": 0.2,
                 "min_exceedances": 40, "bound": "bootstrap"}


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


def test_tail_options_extrapolation_bound_is_one():
    assert TailOptions(max_extrapolation=1.5).max_extrapolation == 1.5
    assert TailOptions(max_extrapolation=1.0).max_extrapolation == 1.0
    with pytest.raises(ValueError, match=r"^TailOptions\.max_extrapolation must be >= 1, got 0\.99$"):
        TailOptions(max_extrapolation=0.99)


def test_tail_options_tail_fraction_error_names_the_field():
    with pytest.raises(ValueError, match=r"^TailOptions\.tail_fraction must lie strictly between 0 and 1, got 1\.5$"):
        TailOptions(tail_fraction=1.5)
