"""Mutants of ``tolstat.models.estimators`` that the other tests do not kill (scipy/numpy references)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tolstat.models.estimators.evt import gev_return_level
from tolstat.models.estimators.quantile import topk_groups


@pytest.mark.parametrize("xi", [-0.3, -0.05, 0.0, 0.1, 0.4])
def test_gev_return_level_is_scipy_isf(xi):
    # scipy's genextreme shape is c = -xi
    q = np.array([0.5, 0.1, 1e-3, 1e-6])
    ref = stats.genextreme.isf(q, -xi, loc=1.5, scale=0.7)
    got = gev_return_level(1.5, 0.7, xi, q)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # scalars in, a numpy scalar out; arrays in, an array out
    s = gev_return_level(1.5, 0.7, xi, 1e-3)
    assert type(s) is np.float64 and s == pytest.approx(ref[2], rel=1e-12)
    assert isinstance(got, np.ndarray) and got.shape == (4,)


def test_topk_groups_k_equal_one_is_the_group_max():
    x = np.array([[3.0, np.nan, 7.0, 1.0], [np.nan, np.nan, -2.0, -5.0]])
    top, n = topk_groups(x, 1)
    np.testing.assert_array_equal(top, [[7.0], [-2.0]])
    np.testing.assert_array_equal(n, [3, 2])
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        topk_groups(x, 0)


# --------------------------------------------------------------------------- GPD fits
from tolstat.models.estimators.evt import gpd_fit_mle, gpd_fit_pwm, gpd_fit_zhang_stephens  # noqa: E402


def _zhang_stephens_reference(x):
    """Zhang & Stephens (2009), eqs. as published, with sorted order statistics.

    Returns (sigma, xi) with xi = -k of the paper.
    """
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    m = 20 + int(np.floor(np.sqrt(n)))
    xstar = x[int(np.floor(n / 4 + 0.5)) - 1]  # first quartile order statistic
    j = np.arange(1, m + 1)
    b = 1 / x[-1] + (1 - np.sqrt(m / (j - 0.5))) / (3 * xstar)
    k = -np.array([np.mean(np.log1p(-bj * x)) for bj in b])
    lik = n * (np.log(b / k) + k - 1)
    w = 1 / np.array([np.sum(np.exp(lik - lj)) for lj in lik])
    bhat = np.sum(b * w)
    khat = -np.mean(np.log1p(-bhat * x))
    return khat / bhat, -khat


@pytest.mark.parametrize(("n", "c", "seed"), [(2, 0.2, 0), (3, -0.3, 1), (9, 0.5, 2), (50, 0.1, 3), (403, -0.2, 4), (5000, 0.1, 4)])
def test_zhang_stephens_matches_the_published_estimator(n, c, seed):
    rng = np.random.default_rng(seed)
    y = stats.genpareto.rvs(c, scale=1.5, size=n, random_state=rng)
    rng.shuffle(y)  # the quartile must be an order statistic of unsorted input too
    fit = gpd_fit_zhang_stephens(y)
    sigma, xi = _zhang_stephens_reference(y)
    assert fit.method == "zhang_stephens" and fit.n == n
    assert fit.sigma == pytest.approx(sigma, rel=1e-12) and fit.xi == pytest.approx(xi, rel=1e-12, abs=1e-14)
    assert fit.loglik == pytest.approx(stats.genpareto.logpdf(y, xi, 0, sigma).sum(), rel=1e-10)


def _pwm_reference(x):
    """Hosking & Wallis (1987): a_s = E[X (1-F)^s] with plotting positions (i - 0.35)/n;
    sigma = 2 a0 a1 / (a0 - 2 a1), k = a0 / (a0 - 2 a1) - 2, xi = -k."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    f = (np.arange(1, n + 1) - 0.35) / n
    a0 = x.mean()
    a1 = np.sum((1 - f) * x) / n
    return 2 * a0 * a1 / (a0 - 2 * a1), -(a0 / (a0 - 2 * a1) - 2)


@pytest.mark.parametrize("y", [[1.0, 1.0, 1.0, 5.0], [0.5, 2.0], [3.0, 0.1, 0.7, 2.2, 9.0]])
def test_pwm_is_hosking_wallis(y):
    fit = gpd_fit_pwm(y)
    sigma, xi = _pwm_reference(y)
    assert fit.method == "pwm" and fit.n == len(y)
    assert fit.sigma == pytest.approx(sigma, rel=1e-13) and fit.xi == pytest.approx(xi, rel=1e-13)
    assert fit.loglik == pytest.approx(stats.genpareto.logpdf(y, xi, 0, sigma).sum(), rel=1e-10)


def test_pwm_recovers_a_known_gpd():
    # n = 20000 draws of GPD(xi=0.2, sigma=1.5): PWM standard errors are about 0.02 (sigma)
    # and 0.015 (xi) (Hosking & Wallis 1987, table 2 asymptotics); 5 standard errors allowed
    y = stats.genpareto.rvs(0.2, scale=1.5, size=20000, random_state=np.random.default_rng(5))
    fit = gpd_fit_pwm(y)
    assert abs(fit.sigma - 1.5) < 0.1 and abs(fit.xi - 0.2) < 0.075


@pytest.mark.parametrize("fitter, name", [(gpd_fit_mle, "mle"), (gpd_fit_pwm, "pwm"),
                                          (gpd_fit_zhang_stephens, "zhang_stephens")])
def test_degenerate_samples_give_the_uniform_boundary(fitter, name):
    # all equal (and a single exceedance): xi = -1, sigma = max(y), the uniform on [0, max]
    for y in ([2.0, 2.0, 2.0], [2.0]):
        fit = fitter(y)
        assert (fit.sigma, fit.xi, fit.method, fit.n) == (2.0, -1.0, name, len(y))
        assert fit.loglik == pytest.approx(-len(y) * np.log(2.0), rel=1e-14)
    with pytest.raises(ValueError, match="no exceedances to fit"):
        fitter([])


def test_gpd_loglik_at_the_uniform_boundary_matches_scipy():
    # xi = -1 is the uniform on [0, sigma]: density 1/sigma including the endpoint y = sigma
    from tolstat.models.estimators.evt import gpd_loglik

    for y, sigma in (([2.0], 2.0), ([0.3, 3.0, 3.0], 3.0), ([0.1, 0.7], 0.7)):
        assert gpd_loglik(y, sigma, -1.0) == pytest.approx(stats.genpareto.logpdf(y, -1.0, 0, sigma).sum(), rel=1e-14)
    assert gpd_loglik([2.5], 2.0, -1.0) == -np.inf  # outside the support


# --------------------------------------------------------------------------- bootstrap
from tolstat.models.estimators.bootstrap import (  # noqa: E402
    bootstrap_quantile_bound,
    bootstrap_quantile_distribution,
    jackknife_quantile,
)


@pytest.mark.parametrize("p", [0.3, 0.9, 0.97])
def test_jackknife_quantile_default_is_numpy_linear_leave_one_out(p):
    x = np.random.default_rng(11).gamma(2.0, size=41)
    vals, mult = jackknife_quantile(x, p)
    loo = np.sort([np.quantile(np.delete(x, i), p) for i in range(x.size)])  # numpy default: linear
    np.testing.assert_allclose(np.sort(np.repeat(vals, mult.astype(np.int64))), loo, rtol=1e-14, atol=0)


def test_bootstrap_quantile_bound_uses_the_quantile_method_and_records_the_seed():
    x = np.random.default_rng(12).exponential(size=300)  # (n - 1) p = 269.1: linear interpolates
    r = bootstrap_quantile_bound(x, 0.9, method="percentile", quantile_method="higher", n_resamples=400, seed=12345)
    # "higher" picks order statistics: the estimate, every resampled quantile and so the
    # percentile bound ('linear' interpolation between two equal-or-data values aside) are data
    assert r.estimate == np.quantile(x, 0.9, method="higher")
    tb = bootstrap_quantile_distribution(x, 0.9, n_resamples=400, seed=12345, method="higher")
    assert np.isin(tb, x).all()
    assert r.bound == np.quantile(tb, 0.95)
    assert (r.seed, r.n_resamples, r.method) == (12345, 400, "percentile")
    lin = bootstrap_quantile_distribution(x, 0.9, n_resamples=400, seed=12345)
    assert not np.isin(lin, x).all()  # the linear statistic interpolates: the methods differ here


def test_bootstrap_quantile_distribution_defaults_and_p_zero():
    x = np.random.default_rng(13).normal(size=50)
    assert bootstrap_quantile_distribution(x, 0.5).shape == (1000,)
    lo = bootstrap_quantile_distribution(x, 0.0, n_resamples=300, seed=1)  # the resample minimum
    assert np.isin(lo, x).all() and lo.min() >= x.min() and np.sum(lo == x.min()) > 300 * 0.5
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\], got -0.1"):
        bootstrap_quantile_distribution(x, -0.1)


# --------------------------------------------------------------------------- return-level bootstrap
from scipy import special  # noqa: E402

from tolstat.models.estimators.bootstrap import bootstrap_return_level_bound  # noqa: E402
from tolstat.models.estimators.evt import gpd_return_level, pot_fit  # noqa: E402


def _tail_sample():
    return np.random.default_rng(24).exponential(1.0, 400)


def test_return_level_bca_acceleration_is_the_exceedance_jackknife():
    x = _tail_sample()
    q, conf = 1e-4, 0.9
    r = bootstrap_return_level_bound(x, q, n_resamples=200, method="bca", seed=2, confidence=conf)
    fit = pot_fit(x, q)
    k = int(fit["n_exceed"])
    y = np.sort(x)[-k:] - fit["u"]
    jack = []
    for i in range(k):  # leave one exceedance out, threshold and rate fixed
        f = gpd_fit_mle(np.delete(y, i), zs_start=True)
        jack.append(gpd_return_level(fit["u"], f.sigma, f.xi, fit["zeta"], q))
    d = np.mean(jack) - np.asarray(jack)
    acc = np.sum(d**3) / (6.0 * np.sum(d**2) ** 1.5)
    assert r.acceleration == pytest.approx(acc, rel=1e-6, abs=1e-12)
    # the BCa level from z0 and a (Efron 1987), at the requested confidence
    zc = special.ndtri(conf)
    assert r.level == pytest.approx(special.ndtr(r.z0 + (r.z0 + zc) / (1 - acc * (r.z0 + zc))), rel=1e-9)
    assert r.estimate == fit["return_level"] and r.method == "bca/parametric"
    assert r.bound > r.estimate


def test_return_level_defaults_and_nonparametric_resampling():
    x = _tail_sample()
    d = bootstrap_return_level_bound(x, 1e-4)
    assert (d.n_resamples, d.method, d.confidence, d.seed) == (1000, "percentile/parametric", 0.95, 0)
    npar = bootstrap_return_level_bound(x, 1e-4, n_resamples=100, resampling="nonparametric", seed=3)
    assert npar.method == "percentile/nonparametric" and np.isfinite(npar.bound)
    par = bootstrap_return_level_bound(x, 1e-4, n_resamples=100, seed=3)
    assert npar.bound != par.bound and npar.estimate == par.estimate


def test_return_level_standard_error_is_the_sample_sd_of_the_resamples():
    # with B = 3 resamples, linear percentiles at 1/4, 1/2, 3/4 reveal all three values
    x = _tail_sample()
    qs = {c: bootstrap_return_level_bound(x, 1e-4, n_resamples=3, seed=9, confidence=c) for c in (0.25, 0.5, 0.75)}
    t2 = qs[0.5].bound
    tb = np.array([2 * qs[0.25].bound - t2, t2, 2 * qs[0.75].bound - t2])
    assert qs[0.5].standard_error == pytest.approx(np.std(tb, ddof=1), rel=1e-9)


def test_bootstrap_accepts_two_values():
    r = bootstrap_quantile_bound([1.0, 3.0], 0.5, n_resamples=50, method="percentile", seed=1)
    assert r.estimate == 2.0 and 1.0 <= r.bound <= 3.0
    with pytest.raises(ValueError, match="at least 2 non-NaN values, got 1"):
        bootstrap_quantile_bound([1.0, np.nan], 0.5)


def test_return_level_bootstrap_runs_with_two_exceedances_and_not_with_a_level_inside_the_data():
    x = np.random.default_rng(1).exponential(size=20)
    fit = pot_fit(x, 1e-3, tail_fraction=0.05, min_exceedances=2)
    assert fit["n_exceed"] == 2
    r = bootstrap_return_level_bound(x, 1e-3, n_resamples=50, tail_fraction=0.05, min_exceedances=2, seed=1)
    assert np.isfinite(r.standard_error) and r.standard_error > 0 and r.bound != r.estimate
    # q >= zeta: the level lies inside the data, nothing to bootstrap: bound = estimate
    inside = bootstrap_return_level_bound(x, 0.2, n_resamples=50, tail_fraction=0.05, min_exceedances=2)
    assert inside.bound == inside.estimate and np.isnan(inside.standard_error)


def test_nan_error_names_the_first_group_with_a_nan():
    from tolstat.models.estimators.quantile import quantile_groups

    x = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, np.nan, 3.0], [np.nan, 1.0, 2.0]])
    with pytest.raises(ValueError, match=r"input contains NaN \(first in group 2\)"):
        quantile_groups(x, [0.5], nan_policy="raise")


def test_order_statistic_bound_per_group_of_a_2d_input():
    from tolstat.models.estimators.orderstat import order_statistic_bound

    rng = np.random.default_rng(8)
    x = rng.exponential(size=(3, 120))
    x[1, 100:] = np.nan  # a smaller group, NaN padded
    bound, rank, n = order_statistic_bound(x, 0.9, 0.9)
    assert n.tolist() == [120, 100, 120]
    for g in range(3):
        v = np.sort(x[g][~np.isnan(x[g])])
        # smallest r with binom.cdf(r - 1, n, p) >= confidence
        r = int(np.argmax(stats.binom.cdf(np.arange(v.size), v.size, 0.9) >= 0.9)) + 1
        assert rank[g] == r and bound[g] == v[r - 1]


def test_order_statistic_rank_names_p_in_its_error():
    from tolstat.models.estimators.orderstat import order_statistic_rank

    with pytest.raises(ValueError, match="^p must lie strictly between 0 and 1, got 1.5"):
        order_statistic_rank(100, 1.5, 0.9)
    with pytest.raises(ValueError, match="^confidence must lie strictly between 0 and 1, got 0"):
        order_statistic_rank(100, 0.5, 0)


def test_pot_fit_of_a_large_sample_takes_the_radix_path_and_matches_the_definition():
    from tolstat.models.estimators.evt import _POT_RADIX_MIN_N

    n = _POT_RADIX_MIN_N + 4464  # 70000 >= the radix-selection size
    x = np.random.default_rng(1).exponential(size=n)
    f = pot_fit(x, 1e-6)
    xs = np.sort(x)
    k = max(30, int(np.ceil(0.1 * n)))  # the documented tail size; u is the largest value below it
    u = xs[n - k - 1]
    y = xs[xs > u] - u
    g = gpd_fit_mle(y, zs_start=False)  # more than 2000 exceedances: no Zhang-Stephens start
    assert f["u"] == u and f["n_exceed"] == y.size and f["zeta"] == y.size / n
    # the same likelihood maximised over differently ordered sums: equal to the optimiser's tolerance
    assert f["sigma"] == pytest.approx(g.sigma, rel=1e-8) and f["xi"] == pytest.approx(g.xi, abs=1e-8)
    assert f["return_level"] == pytest.approx(gpd_return_level(u, g.sigma, g.xi, y.size / n, 1e-6), rel=1e-8)


def test_pot_fit_groups_of_no_groups_and_of_integer_values():
    from tolstat.models.estimators.evt import pot_fit_groups

    params, n = pot_fit_groups(np.zeros((0, 50)), 1e-3)
    assert params.shape == (0, 8) and n.shape == (0,)
    x = np.random.default_rng(0).integers(0, 100, (2, 200))
    pi, ni = pot_fit_groups(x, 1e-3)
    pf, nf = pot_fit_groups(x.astype(np.float64), 1e-3)
    np.testing.assert_array_equal(pi, pf)
    np.testing.assert_array_equal(ni, nf)


def test_order_statistic_min_n_names_its_arguments_and_handles_n_one():
    from tolstat.models.estimators.orderstat import order_statistic_min_n

    with pytest.raises(ValueError, match="^p must lie strictly between 0 and 1, got 1.5"):
        order_statistic_min_n(1.5, 0.9)
    with pytest.raises(ValueError, match="^confidence must lie strictly between 0 and 1, got 1"):
        order_statistic_min_n(0.5, 1)
    assert order_statistic_min_n(0.1, 0.5) == 1  # 1 - 0.1 >= 0.5: one run suffices
    assert (order_statistic_min_n(0.95, 0.95), order_statistic_min_n(0.99, 0.95)) == (59, 299)


def test_quantiles_of_integer_values_are_numpy_quantiles():
    from tolstat.models.estimators.quantile import quantile_groups

    x = np.array([[3, 1, 2, 5, 8], [10, 0, 7, 7, 1]])
    q, n = quantile_groups(x, [0.3, 0.5, 0.9])
    np.testing.assert_array_equal(q, np.quantile(x.astype(np.float64), [0.3, 0.5, 0.9], axis=1).T)
    assert q.dtype == np.float64 and n.tolist() == [5, 5]
