"""``bounds``, ``estimators._apply`` and ``estimators.bootstrap``: mutants of further samples.

References: the closed forms in the docstrings (the conservative GPD tail bound, the
Sidak split, the GPD return level), scipy (``kstest``, ``genpareto``, ``norm``,
``chi2``), numpy quantiles, and direct calls of the documented functions for the
plumbing of :func:`tolstat.models.estimators.fit` and :func:`tolstat.calibration.calibrate`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

import tolstat
from estimators_helpers import make_errors
from tolstat.calibration.bounds import TailOptions, tail_fit
from tolstat._base.inference import split_budget
from tolstat.models.estimators import fit, group_values
from tolstat.models.estimators.bootstrap import bootstrap_quantile_bound, bootstrap_return_level_bound
from tolstat.models.estimators.evt import pot_fit


def _gpd_return_level(u, sigma, xi, zeta, q):
    """u + sigma/xi ((zeta/q)**xi - 1); u + sigma log(zeta/q) at xi = 0."""
    if xi == 0:
        return u + sigma * math.log(zeta / q)
    return u + sigma / xi * ((zeta / q) ** xi - 1.0)


# ------------------------------------------------------------------ bounds
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


def test_sidak_split_is_the_exact_independent_share():
    a, m = 0.05, 4
    s = split_budget(a, m, method="sidak", independent=True)
    assert s == pytest.approx(1.0 - (1.0 - a) ** (1.0 / m), rel=1e-14)
    assert 1.0 - (1.0 - s) ** m == pytest.approx(a, rel=1e-13)  # m independent checks: total budget a


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


# ------------------------------------------------------------------ estimators.bootstrap
def test_return_level_bound_inside_the_data_is_the_empirical_estimate():
    # q >= zeta: the level lies inside the data, nothing to model: bound = estimate = the
    # 'higher' empirical (1 - q)-quantile
    x = np.random.default_rng(7).exponential(size=300)
    r = bootstrap_return_level_bound(x, 0.2, n_resamples=200)  # zeta = 30/300 = 0.1 < q
    assert r.estimate == np.quantile(x, 0.8, method="higher")
    assert r.bound == r.estimate and math.isnan(r.standard_error)


def test_return_level_bound_passes_the_tail_fraction():
    x = np.random.default_rng(8).exponential(size=1000)
    r = bootstrap_return_level_bound(x, 1e-4, tail_fraction=0.2, n_resamples=200, seed=1)
    f = pot_fit(x, 1e-4, tail_fraction=0.2)
    assert f["n_exceed"] == 200
    assert r.estimate == pytest.approx(_gpd_return_level(f["u"], f["sigma"], f["xi"], f["zeta"], 1e-4), rel=1e-12)


def test_bca_return_level_jackknife_is_over_the_exceedances():
    # the acceleration of the BCa return-level bound comes from a jackknife over the k
    # exceedances (threshold fixed): refit the GPD without each one, in closed form for the
    # return level, and take the usual skewness formula
    x = np.random.default_rng(9).exponential(size=400)
    q = 1e-4
    r = bootstrap_return_level_bound(x, q, method="bca", n_resamples=300, seed=3)
    f = pot_fit(x, q)
    k, u = f["n_exceed"], f["u"]
    y = np.sort(x)[-k:] - u
    jack = []
    for i in range(k):
        yi = np.delete(y, i)
        xi, _, sigma = stats.genpareto.fit(yi, floc=0.0)
        jack.append(_gpd_return_level(u, sigma, xi, f["zeta"], q))
    jack = np.array(jack)
    d = jack.mean() - jack
    acc = np.sum(d**3) / (6.0 * np.sum(d**2) ** 1.5)
    assert r.acceleration == pytest.approx(acc, abs=0.01)  # scipy's optimiser vs the profile MLE
    assert abs(r.acceleration) > 0.02


def test_bootstrap_of_integer_scores_equals_that_of_the_same_floats():
    xi = np.random.default_rng(10).integers(0, 50, size=200)
    a = bootstrap_quantile_bound(xi, 0.9, n_resamples=200, seed=4)
    b = bootstrap_quantile_bound(xi.astype(np.float64), 0.9, n_resamples=200, seed=4)
    assert (a.bound, a.estimate, a.level) == (b.bound, b.estimate, b.level)


# ------------------------------------------------------------------ estimators._apply
def test_gpd_and_rank_fits_same_through_dask():
    pytest.importorskip("dask")
    rng = np.random.default_rng(11)
    ds = make_errors({("a", "float32", "cpu"): rng.exponential(size=320),
                      ("b", "float32", "cpu"): rng.exponential(size=300)})
    for method, kw in (("gpd", {"q": 1e-4}), ("order_statistic", {"p": 0.99})):
        eager = fit(ds, method=method, **kw)
        lazy = fit(ds, method=method, chunks={"op": 1}, **kw).compute()
        for v in eager.data_vars:
            np.testing.assert_array_equal(lazy[v].values, eager[v].values)
    lazy = fit(ds, method="order_statistic", p=0.99, chunks={"op": 1})
    assert lazy["rank"].chunks is not None  # the rank stays lazy like the thresholds
    assert lazy["rank"].compute().values.tolist() == fit(ds, method="order_statistic", p=0.99)["rank"].values.tolist()


def test_fit_attributes_record_method_and_sorted_settings():
    ds = make_errors({("a", "float32", "cpu"): np.random.default_rng(12).exponential(size=300)})
    out = fit(ds, method="order_statistic", p=0.99, confidence=0.9)
    assert out.attrs["method"] == "order_statistic"
    assert out.attrs["settings"] == json.dumps({"confidence": 0.9, "p": 0.99})  # keys sorted


def test_bootstrap_fit_of_the_return_level_passes_its_seed():
    x = np.random.default_rng(13).exponential(size=400)
    ds = make_errors({("a", "float32", "cpu"): x})
    out = fit(ds, method="bootstrap", target="return_level", q=1e-4, n_resamples=200, seed=11,
              interval="percentile")
    ref = bootstrap_return_level_bound(x, 1e-4, n_resamples=200, seed=11, method="percentile")
    assert float(out["threshold"].item()) == ref.bound
    assert ref.bound != bootstrap_return_level_bound(x, 1e-4, n_resamples=200, seed=0, method="percentile").bound


def test_group_values_of_float32_samples_are_float64():
    ds = make_errors({("a", "float32", "cpu"): [0.5, 0.25, 0.125]}, sample_size=2)  # no NaN padding
    ds["sample_abs"] = ds["sample_abs"].astype(np.float32)
    da, present = group_values(ds, "sample_abs")
    assert da.dtype == np.float64 and bool(present.all())
    np.testing.assert_array_equal(da.values.ravel(), ds["sample_abs"].values.astype(np.float64).ravel())


def test_fit_output_marks_present_groups():
    rng = np.random.default_rng(14)
    ds = make_errors({("a", "float32", "cpu"): rng.exponential(size=300), ("b", "float16", "cpu"): rng.exponential(size=300)})
    out = fit(ds, method="order_statistic", p=0.99)
    assert out["present"].dtype == bool and out["present"].dims == ("op", "dtype", "hardware")
    assert out["present"].sel(hardware="cpu").values.tolist() == [[False, True], [True, False]]  # dtype: float16, float32
