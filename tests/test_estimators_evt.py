"""GPD / GEV fits against scipy, return levels, degenerate tails."""

import math

import numpy as np
import pytest
from scipy import stats

from tolstat.models.estimators import (
    evt,
    gev_fit_mle,
    gev_loglik,
    gev_return_level,
    gpd_fit_mle,
    gpd_fit_pwm,
    gpd_fit_zhang_stephens,
    gpd_loglik,
    gpd_return_level,
    pot_fit,
    pot_fit_groups,
    quantile_groups,
)


@pytest.mark.parametrize("xi", [-0.4, -0.1, 0.0, 0.2, 0.5])
@pytest.mark.parametrize("n", [150, 4000])
def test_gpd_mle_at_least_scipy(xi, n):
    rng = np.random.default_rng(100 + n)
    y = stats.genpareto.rvs(xi, scale=1.5, size=n, random_state=rng)
    fit = gpd_fit_mle(y)
    c, _, s = stats.genpareto.fit(y, floc=0)
    ll_scipy = stats.genpareto.logpdf(y, c, 0, s).sum()
    assert fit.loglik >= ll_scipy - 1e-6
    assert math.isclose(fit.loglik, stats.genpareto.logpdf(y, fit.xi, 0, fit.sigma).sum(), rel_tol=1e-10)
    assert math.isclose(gpd_loglik(y, fit.sigma, fit.xi), fit.loglik, rel_tol=1e-12)
    # closed-form estimators are in the right neighbourhood
    for est in (gpd_fit_zhang_stephens(y), gpd_fit_pwm(y)):
        assert abs(est.xi - fit.xi) < 0.25 and est.sigma > 0


@pytest.mark.parametrize("xi", [-0.3, 0.0, 0.2])
def test_gev_mle_at_least_scipy(xi):
    rng = np.random.default_rng(7)
    x = stats.genextreme.rvs(-xi, loc=1.0, scale=2.0, size=800, random_state=rng)
    g = gev_fit_mle(x)
    c, loc, scale = stats.genextreme.fit(x)
    assert g["loglik"] >= stats.genextreme.logpdf(x, c, loc, scale).sum() - 1e-6
    assert math.isclose(g["loglik"], gev_loglik(x, g["mu"], g["sigma"], g["xi"]), rel_tol=1e-10)
    assert math.isclose(g["return_level"], stats.genextreme.ppf(0.99, -g["xi"], g["mu"], g["sigma"]), rel_tol=1e-9)


def test_return_level_formula_limits_and_endpoint():
    u, s, zeta, q = 1.0, 2.0, 0.1, 1e-4
    rl = gpd_return_level(u, s, [0.3, 1e-14, 0.0, -1e-9, -0.5], zeta, q)
    assert math.isclose(rl[0], u + s / 0.3 * ((zeta / q) ** 0.3 - 1))
    assert math.isclose(rl[1], u + s * math.log(zeta / q), rel_tol=1e-12)
    assert math.isclose(rl[2], rl[1]) and math.isclose(rl[3], rl[1], rel_tol=1e-6)  # continuous at 0
    assert rl[4] <= u - s / -0.5
    # bounded tail: as q -> 0 the level approaches, never exceeds, the endpoint
    assert gpd_return_level(u, s, -0.5, zeta, 1e-300) == pytest.approx(u + s / 0.5)
    # equals scipy's conditional quantile
    assert math.isclose(rl[0], u + stats.genpareto.ppf(1 - q / zeta, 0.3, 0, s), rel_tol=1e-10)
    with pytest.raises(ValueError, match=r"q must lie in \(0, zeta_u\]"):
        gpd_return_level(u, s, 0.1, zeta, 0.5)
    assert math.isclose(gev_return_level(0.0, 1.0, 0.0, 0.01), -math.log(-math.log(0.99)))


@pytest.mark.slow
def test_pot_threshold_rule_and_bounded_tail():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, 20000)  # bounded: the tail estimate must respect the endpoint ~ 1
    f = pot_fit(x, 1e-9)
    assert f["n_exceed"] == 2000 and f["zeta"] == pytest.approx(0.1)
    assert f["xi"] < 0 and f["return_level"] <= f["endpoint"] + 1e-12
    assert f["return_level"] < 1.05
    # exponential: the return level approaches log(1/q)
    e = rng.exponential(1.0, 200000)
    assert pot_fit(e, 1e-6)["return_level"] == pytest.approx(math.log(1e6), rel=0.1)
    # q inside the data: empirical quantile
    f2 = pot_fit(e[:1000], 0.5)
    assert f2["return_level"] == np.quantile(e[:1000], 0.5, method="higher")


def test_degenerate_tails_never_nan():
    for x in (np.zeros(100), np.full(100, 3.0)):
        f = pot_fit(x, 1e-6)
        assert f["return_level"] == x[0] and f["sigma"] == 0.0
    lat = np.repeat([0.0, 1.0, 2.0], [900, 90, 10])
    f = pot_fit(lat, 1e-6)
    assert np.isfinite(f["return_level"]) and f["return_level"] <= 2.0
    assert gpd_fit_mle(np.full(10, 2.0)).xi == -1.0
    g = gev_fit_mle(np.full(20, 5.0))
    assert g["return_level"] == 5.0


def test_pot_groups_and_errors():
    rng = np.random.default_rng(5)
    x = rng.exponential(1.0, (4, 500))
    x[1, 100:] = np.nan
    x[2, 20:] = np.nan  # too small for min_exceedances=30 -> NaN row
    params, n = pot_fit_groups(x, 1e-4)
    assert list(n) == [500, 100, 20, 500]
    assert np.isnan(params[2]).all() and not np.isnan(params[[0, 1, 3]]).any()
    # each row is fitted on that row's valid values only: threshold rule max(30, ceil(0.1 n)),
    # u = the value just below the exceedances, zeta = k / n, and the closed-form return level
    for i in (0, 1, 3):
        v = np.sort(x[i][~np.isnan(x[i])])
        k = max(30, int(np.ceil(0.1 * v.size)))
        u, sigma, xi, zeta, n_exc = params[i, :5]
        assert n_exc == k and zeta == k / v.size and u == v[-k - 1], i
        rl = u + sigma / xi * ((zeta / 1e-4) ** xi - 1)
        assert params[i, 7] == pytest.approx(rl, rel=1e-10), i
    with pytest.raises(ValueError, match="nonnegative"):
        pot_fit_groups(-x, 1e-4)
    with pytest.raises(ValueError, match="n >= 31"):
        pot_fit(np.ones(10), 1e-3)
    with pytest.raises(ValueError, match="inf"):
        pot_fit_groups(np.array([1.0, np.inf] * 40), 1e-3)


@pytest.mark.parametrize("scale", [2.0**-1000, 1e-200, 1e200, 1e300])
def test_pot_fit_is_scale_equivariant_at_extreme_magnitudes(scale):
    """Scores far from 1 (errors of 1e-300 or 1e300) are fitted, not crashed on: u, sigma,
    endpoint and return level scale with the data, xi, zeta and the exceedance count do
    not, and the log-likelihood shifts by -n_exceed log(scale)."""
    base = 1.0 + np.random.default_rng(3).pareto(3.0, (2, 400))
    from tolstat.models.estimators import evt

    ref, _ = evt.pot_fit_groups(base, 0.001)
    got, _ = evt.pot_fit_groups(base * scale, 0.001)
    f = {k: j for j, k in enumerate(evt.POT_FIELDS)}
    for k in ("u", "sigma", "return_level"):
        np.testing.assert_allclose(got[:, f[k]] / scale, ref[:, f[k]], rtol=1e-8)
    for k in ("xi", "zeta"):
        np.testing.assert_allclose(got[:, f[k]], ref[:, f[k]], rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(got[:, f["n_exceed"]], ref[:, f["n_exceed"]])
    np.testing.assert_allclose(got[:, f["loglik"]] + got[:, f["n_exceed"]] * np.log(scale),
                               ref[:, f["loglik"]], rtol=1e-8, atol=1e-6)
    # one group far from 1, one near 1: each is fitted on its own scale
    mixed, _ = evt.pot_fit_groups(np.vstack([base[0] * scale, base[1]]), 0.001)
    np.testing.assert_allclose(mixed[1], ref[1], rtol=1e-12)
    np.testing.assert_allclose(mixed[0, f["sigma"]] / scale, ref[0, f["sigma"]], rtol=1e-8)


# --------------------------------------------------------------------------- return levels, GPD fits, POT
# Return levels, Zhang-Stephens, PWM, degenerate samples, POT paths.


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


def _zhang_stephens_reference(x):
    """Zhang & Stephens (2009), written from the paper: returns (sigma, xi)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    m = 20 + int(math.sqrt(n))
    xstar = x[int(n / 4 + 0.5) - 1]  # the first quartile
    if xstar <= 0:  # the quartile of a sample with many zeros: the mean instead
        xstar = x.mean()
    j = np.arange(1, m + 1)
    b = 1.0 / x[-1] + (1.0 - np.sqrt(m / (j - 0.5))) / (3.0 * xstar)
    k = -np.array([np.mean(np.log1p(-bj * x)) for bj in b])
    lik = n * (np.log(b / k) + k - 1.0)
    w = 1.0 / np.array([np.sum(np.exp(lik - lj)) for lj in lik])
    bhat = float(np.sum(b * w))
    khat = -float(np.mean(np.log1p(-bhat * x)))
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


def test_zhang_stephens_with_a_zero_lower_quartile_uses_the_mean():
    rng = np.random.default_rng(1)
    y = np.concatenate([np.zeros(40), rng.exponential(2.0, 60)])  # 40% zeros: quartile 0
    got = gpd_fit_zhang_stephens(y)
    sigma, xi = _zhang_stephens_reference(y)
    assert got.sigma == pytest.approx(sigma, rel=1e-9)
    assert got.xi == pytest.approx(xi, rel=1e-9, abs=1e-12)


def test_gev_fit_groups_default_level_is_one_in_a_hundred():
    x = stats.genextreme.rvs(-0.1, loc=3.0, scale=0.5, size=(2, 200), random_state=4)
    params, n = evt.gev_fit_groups(x)
    f = {k: j for j, k in enumerate(evt.GEV_FIELDS)}
    assert list(n) == [200, 200]
    for row in params:
        # scipy's shape c is -xi; the return level of exceedance probability 0.01
        rl = stats.genextreme.isf(0.01, -row[f["xi"]], loc=row[f["mu"]], scale=row[f["sigma"]])
        assert row[f["return_level"]] == pytest.approx(rl, rel=1e-9)


def test_gpd_return_level_of_scalars_is_a_float():
    r = evt.gpd_return_level(1.0, 0.5, 0.2, 0.1, 0.001)
    assert isinstance(r, float)
    assert r == pytest.approx(stats.genpareto.isf(0.001 / 0.1, 0.2, loc=1.0, scale=0.5), rel=1e-12)
    v = evt.gpd_return_level([1.0, 2.0], 0.5, 0.2, 0.1, 0.001)
    assert isinstance(v, np.ndarray) and v.shape == (2,)


def test_fits_and_quantiles_of_integer_samples_equal_the_float_ones():
    xi = np.random.default_rng(5).integers(1, 1000, size=(2, 300))
    xf = xi.astype(np.float64)
    np.testing.assert_array_equal(evt.pot_fit_groups(xi, 0.001)[0], evt.pot_fit_groups(xf, 0.001)[0])
    assert evt.gev_fit_mle(xi[0]) == evt.gev_fit_mle(xf[0])
    np.testing.assert_array_equal(quantile_groups(xi, [0.5, 0.99])[0],
                                  np.quantile(xf, [0.5, 0.99], axis=1).T)
    # float32 samples are fitted in float64 (the kernels' arithmetic), like their float64 values
    x32 = (np.random.default_rng(8).pareto(3.0, size=(2, 300)) + 1.0).astype(np.float32)
    np.testing.assert_array_equal(evt.pot_fit_groups(x32, 0.001)[0],
                                  evt.pot_fit_groups(x32.astype(np.float64), 0.001)[0])
    assert evt.gev_fit_mle(x32[0]) == evt.gev_fit_mle(x32[0].astype(np.float64))
    wide = np.random.default_rng(7).integers(0, 10**6, size=(2, 3000))  # the radix path (>= 1024 values)
    np.testing.assert_array_equal(quantile_groups(wide, [0.1, 0.999])[0],
                                  np.quantile(wide.astype(np.float64), [0.1, 0.999], axis=1).T)
