"""Bootstrap bounds: agreement with scipy, reproducibility, exact O(n) jackknife."""

import numba
import numpy as np
import pytest
from scipy import stats

from tolstat.estimators import (
    bootstrap_quantile_bound,
    bootstrap_quantile_distribution,
    bootstrap_return_level_bound,
    jackknife_quantile,
)


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


def test_bca_close_to_scipy_and_reproducible():
    rng = np.random.default_rng(22)
    x = rng.lognormal(size=300)
    r = bootstrap_quantile_bound(x, 0.9, n_resamples=2000, method="bca", seed=9)
    ref = stats.bootstrap((x,), lambda a, axis: np.quantile(a, 0.9, axis=axis), n_resamples=2000,
                          method="BCa", alternative="less", confidence_level=0.95, rng=1)
    assert abs(r.bound - ref.confidence_interval.high) <= 0.6 * r.standard_error + 0.1
    assert r.bound >= r.estimate
    # same seed -> same result, whatever the thread count
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


def test_resample_statistic_is_numpy_quantile_of_some_resample():
    # each bootstrap value must be the numpy quantile of a multiset of the data: check range
    x = np.arange(50, dtype=float)
    tb = bootstrap_quantile_distribution(x, 0.5, n_resamples=200, seed=1)
    assert np.all((tb >= 0) & (tb <= 49)) and np.all(np.isin(tb * 2, np.arange(99)))


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
    with pytest.raises(ValueError):
        bootstrap_quantile_bound([1.0], 0.5)
    with pytest.raises(ValueError, match="method"):
        bootstrap_quantile_bound(y, 0.5, method="basic")
