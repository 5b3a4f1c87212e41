"""GPD / GEV fits against scipy, return levels, degenerate tails."""

import math

import numpy as np
import pytest
from scipy import stats

from tolstat.models.estimators import (
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
