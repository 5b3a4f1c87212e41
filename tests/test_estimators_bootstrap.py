"""Bootstrap bounds: agreement with scipy, reproducibility, exact O(n) jackknife."""

import math

import numba
import numpy as np
import pytest
from scipy import special, stats

from tolstat.models.estimators import (
    bootstrap_quantile_bound,
    bootstrap_quantile_distribution,
    bootstrap_return_level_bound,
    gpd_fit_mle,
    gpd_return_level,
    jackknife_quantile,
    pot_fit,
)
from tolstat.models.estimators.bootstrap import bca_level


@pytest.mark.parametrize("p", [0.5, 0.9])
def test_percentile_bound_matches_scipy(p):
    """Our percentile upper bound vs scipy.stats.bootstrap(method='percentile',
    alternative='less'), both with B = 3000 independent resamples.

    Tolerance: each bound is the 0.95-quantile of B bootstrap draws, whose Monte-Carlo
    standard error is about sqrt(g (1 - g) / B) / f(xi_g) ~ 0.05 s for g = 0.95 (f the
    normal density with the bootstrap standard deviation s); the difference of two
    independent estimates has SE ~ 0.07 s, and the bootstrap distribution of a quantile
    is discrete (order statistics), adding up to about one gap. We allow 0.5 s (> 6 SE),
    plus the largest gap between order statistics near the target.
    """
    rng = np.random.default_rng(21)
    x = np.abs(rng.standard_normal(400))
    B = 3000
    ours = bootstrap_quantile_bound(x, p, confidence=0.95, n_resamples=B, method="percentile", seed=4)
    ref = stats.bootstrap((x,), lambda a, axis: np.quantile(a, p, axis=axis), n_resamples=B,
                          method="percentile", alternative="less", confidence_level=0.95, rng=5)
    s = ours.standard_error
    xs = np.sort(x)
    k = int(p * 399)
    gap = np.max(np.diff(xs[max(0, k - 40): k + 40]))
    assert abs(ours.bound - ref.confidence_interval.high) <= 0.5 * s + gap
    assert abs(s - ref.standard_error) <= 0.15 * s


def _bca_bound_mc(fn, seeds):
    vals = np.array([fn(s) for s in seeds])
    return vals.mean(), vals.std(ddof=1) / np.sqrt(vals.size)


def test_bca_matches_scipy_and_differs_from_percentile():
    """A skewed case (lognormal, sigma 1.5, the 0.9-quantile of 200) where BCa moves the bound
    well above the percentile bound. Both tolstat's and scipy's BCa bounds are Monte-Carlo
    estimates: each is averaged over K seeds and the means must agree within 4 combined
    standard errors of the mean (measured here from the K seeds). The percentile bound must
    be more than twice that tolerance below -- the test can tell the two apart."""
    x = np.random.default_rng(22).lognormal(0.0, 1.5, 200)
    p, B, K = 0.9, 2000, 8
    ours, se_o = _bca_bound_mc(lambda s: bootstrap_quantile_bound(x, p, n_resamples=B, method="bca", seed=s).bound,
                               range(K))
    pct, _ = _bca_bound_mc(lambda s: bootstrap_quantile_bound(x, p, n_resamples=B, method="percentile",
                                                              seed=s).bound, range(K))
    ref, se_s = _bca_bound_mc(
        lambda s: stats.bootstrap((x,), lambda a, axis: np.quantile(a, p, axis=axis), n_resamples=B, method="BCa",
                                  alternative="less", confidence_level=0.95, rng=100 + s).confidence_interval.high,
        range(K))
    tol = 4.0 * float(np.hypot(se_o, se_s))
    assert tol > 0
    assert abs(ours - ref) <= tol, (ours, ref, tol)
    assert ref - pct > 2 * tol, (pct, ref, tol)  # percentile is many tolerances below


def _splitmix_resample_indices(seed, b, m):
    """Independent (pure Python) re-implementation of the documented splitmix64 streams."""
    M64 = (1 << 64) - 1
    G, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def mix(z):
        z = ((z ^ (z >> 30)) * M1) & M64
        z = ((z ^ (z >> 27)) * M2) & M64
        return z ^ (z >> 31)

    st = mix(mix((seed + G) & M64) ^ ((b * M2 + G) & M64))
    out = []
    for _ in range(m):
        st = (st + G) & M64
        out.append(min(int((mix(st) >> 11) * 2.0**-53 * m), m - 1))
    return np.array(out)


@pytest.mark.parametrize("qmethod", ["linear", "lower", "higher", "nearest"])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.93])
def test_resample_statistic_is_numpy_quantile_of_its_resample(qmethod, p):
    """Each bootstrap value is np.quantile(resample b, p, method) bit for bit, the resample
    rebuilt from the documented (seed, b) stream: catches a wrong quantile method, a wrong
    walk direction or an off-by-one in the counting selection."""
    x = np.random.default_rng(7).lognormal(size=41)
    xs = np.sort(x)
    tb = bootstrap_quantile_distribution(x, p, n_resamples=24, seed=5, method=qmethod)
    want = [np.quantile(xs[_splitmix_resample_indices(5, b, xs.size)], p, method=qmethod) for b in range(24)]
    np.testing.assert_array_equal(tb, want)


def test_bca_level_is_the_documented_formula():
    """bca_level / bootstrap_quantile_bound against the BCa formula computed here: z0 from the
    mid-rank proportion, acceleration from a brute-force jackknife (np.delete + np.quantile),
    level = Phi(z0 + (z0 + z_c) / (1 - a (z0 + z_c))), bound = np.quantile(theta*, level).
    Exact to rounding, so a flipped sign of z0 or of a, or a wrong jackknife, fails."""
    from scipy.special import ndtr, ndtri

    x = np.random.default_rng(31).lognormal(0.0, 1.5, 150)
    p, B, g = 0.85, 999, 0.95
    r = bootstrap_quantile_bound(x, p, n_resamples=B, method="bca", seed=3, confidence=g)
    tb = bootstrap_quantile_distribution(x, p, n_resamples=B, seed=3)
    theta = np.quantile(x, p)
    prop = (np.sum(tb < theta) + np.sum(tb <= theta)) / (2.0 * B)
    z0 = ndtri(prop)
    jack = np.array([np.quantile(np.delete(x, i), p) for i in range(x.size)])
    d = jack.mean() - jack
    acc = np.sum(d**3) / (6.0 * np.sum(d**2) ** 1.5)
    zc = ndtri(g)
    level = ndtr(z0 + (z0 + zc) / (1.0 - acc * (z0 + zc)))
    assert abs(z0) > 0.02 and abs(acc) > 0.01  # both corrections matter in this case
    assert r.z0 == pytest.approx(z0, rel=1e-12)
    assert r.acceleration == pytest.approx(acc, rel=1e-9)
    assert r.level == pytest.approx(level, rel=1e-9)
    assert r.bound == pytest.approx(np.quantile(tb, level), rel=1e-12)
    assert r.estimate == theta and r.bound >= r.estimate
    # the proportion is clipped to [1/(2B), 1 - 1/(2B)]: every resample above / below the estimate
    jk = np.array([1.0, 2.0, 4.0])  # mean 7/3: d = (4/3, 1/3, -5/3), sum d^3 = -60/27, sum d^2 = 42/9
    a_ref = (-60 / 27) / (6 * (42 / 9) ** 1.5)
    for tb_c, prop in ((np.full(10, 2.0), 0.5 / 10), (np.full(10, 0.5), 1 - 0.5 / 10)):
        lvl, z, a = bca_level(tb_c, 1.0, jk, 0.9)
        assert z == pytest.approx(ndtri(prop), rel=1e-12) and a == pytest.approx(a_ref, rel=1e-12)
        zc = ndtri(0.9)
        assert lvl == pytest.approx(ndtr(z + (z + zc) / (1 - a_ref * (z + zc))), rel=1e-12)
    # multiplicities weigh the jackknife values: (1, 2, 4) with weights (1, 1, 2) = (1, 2, 4, 4)
    _, _, aw = bca_level(np.arange(10.0), 4.5, jk, 0.9, np.array([1.0, 1.0, 2.0]))
    _, _, ab = bca_level(np.arange(10.0), 4.5, np.array([1.0, 2.0, 4.0, 4.0]), 0.9)
    assert aw == pytest.approx(ab, rel=1e-12) and aw != pytest.approx(a_ref)


def test_bootstrap_reproducible_whatever_the_threads():
    x = np.random.default_rng(22).lognormal(size=300)
    t0 = numba.get_num_threads()
    a = bootstrap_quantile_distribution(x, 0.9, n_resamples=500, seed=3)
    numba.set_num_threads(1)
    try:
        b = bootstrap_quantile_distribution(x, 0.9, n_resamples=500, seed=3)
    finally:
        numba.set_num_threads(t0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, bootstrap_quantile_distribution(x, 0.9, n_resamples=500, seed=4))


@pytest.mark.parametrize("method", ["linear", "higher", "lower"])
def test_jackknife_exact(method):
    rng = np.random.default_rng(23)
    for x in (rng.standard_normal(101), rng.integers(0, 4, 60).astype(float)):
        for p in (0.0, 0.3, 0.9, 0.999, 1.0):
            vals, mult = jackknife_quantile(x, p, method=method)
            brute = np.array([np.quantile(np.delete(x, i), p, method=method) for i in range(x.size)])
            assert mult.sum() == x.size
            np.testing.assert_array_equal(np.sort(np.repeat(vals, mult.astype(int))), np.sort(brute))


@pytest.mark.slow
def test_return_level_bounds_and_degenerate():
    rng = np.random.default_rng(24)
    y = rng.exponential(1.0, 3000)
    for method in ("percentile", "bca"):
        for rs in ("parametric", "nonparametric"):
            r = bootstrap_return_level_bound(y, 1e-4, n_resamples=200, method=method, resampling=rs, seed=2)
            assert r.bound > r.estimate > 5
    z = bootstrap_return_level_bound(np.zeros(500), 1e-4, n_resamples=50)
    assert z.bound == 0.0
    with pytest.raises(ValueError, match="at least 2 non-NaN values, got 1"):
        bootstrap_quantile_bound([1.0], 0.5)
    with pytest.raises(ValueError, match="method"):
        bootstrap_quantile_bound(y, 0.5, method="basic")


# --------------------------------------------------------------------------- quantile and return-level bounds
# References: the GPD return level in closed form, scipy's GPD fit for the jackknife, numpy
# quantiles, and Efron's (1987) BCa level.


def _gpd_return_level(u, sigma, xi, zeta, q):
    """u + sigma/xi ((zeta/q)**xi - 1); u + sigma log(zeta/q) at xi = 0."""
    if xi == 0:
        return u + sigma * math.log(zeta / q)
    return u + sigma / xi * ((zeta / q) ** xi - 1.0)


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
