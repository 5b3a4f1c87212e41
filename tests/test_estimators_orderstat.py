"""Order-statistic and split-conformal bounds: ranks, errors and coverage by simulation."""

import numpy as np
import pytest
from scipy import stats

from tolstat.models.estimators import (
    conformal_bound,
    conformal_min_n,
    conformal_rank,
    kth_smallest_groups,
    order_statistic_bound,
    order_statistic_min_n,
    order_statistic_rank,
)

P_REJECT = 1e-3  # one-sided binomial test level for "coverage is below nominal"

# name -> (sampler(rng, shape), true p-quantile function)
DISTS = {
    "abs_normal": (lambda r, s: np.abs(r.standard_normal(s)), lambda p: stats.halfnorm.ppf(p)),
    "halfnormal": (lambda r, s: stats.halfnorm.rvs(scale=2.0, size=s, random_state=r),
                   lambda p: stats.halfnorm.ppf(p, scale=2.0)),
    "lognormal": (lambda r, s: r.lognormal(0.0, 1.0, s), lambda p: stats.lognorm.ppf(p, 1.0)),
    "uniform": (lambda r, s: r.random(s), lambda p: p),
    "abs_t3": (lambda r, s: np.abs(r.standard_t(3, s)), lambda p: stats.t.ppf((1 + p) / 2, 3)),
    # ULP-like lattice with heavy ties: floor(|N(0, 3)|), P(X <= k) = P(|Z| < (k+1)/3)
    "lattice": (lambda r, s: np.floor(np.abs(r.standard_normal(s)) * 3.0),
                lambda p: float(np.ceil(stats.halfnorm.ppf(p) * 3.0) - 1.0)),
}


def _lattice_check():
    # the lattice's true quantile really is the smallest k with F(k) >= p
    for p in (0.9, 0.95, 0.99):
        k = DISTS["lattice"][1](p)
        assert stats.halfnorm.cdf((k + 1) / 3.0) >= p > stats.halfnorm.cdf(k / 3.0)


def test_ranks_and_min_n():
    assert order_statistic_min_n(0.95, 0.95) == 59
    assert order_statistic_min_n(0.99, 0.95) == 299
    assert conformal_min_n(0.01) == 99
    r = order_statistic_rank([59, 100, 1000, 5000], 0.95, 0.95)
    for n, ri in zip([59, 100, 1000, 5000], r):
        assert stats.binom.cdf(ri - 1, n, 0.95) >= 0.95
        assert ri == 1 or stats.binom.cdf(ri - 2, n, 0.95) < 0.95
    assert r[0] == 59  # the maximum
    np.testing.assert_array_equal(conformal_rank([99, 199], 0.01), [99, 198])
    _lattice_check()


def test_too_small_errors_name_min_n():
    with pytest.raises(ValueError, match="n >= 59"):
        order_statistic_rank(58, 0.95, 0.95)
    with pytest.raises(ValueError, match="n >= 99"):
        conformal_rank(98, 0.01)
    with pytest.raises(ValueError, match="n >= 299"):
        order_statistic_bound(np.ones(100), 0.99, 0.95)
    with pytest.raises(ValueError, match="empty"):
        order_statistic_bound(np.full((2, 5), np.nan), 0.5, 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        order_statistic_rank(10, 1.0, 0.9)


def _os_coverage(sample, qtrue, n, p, gamma, R, rng, shift=0):
    x = sample(rng, (R, n))
    r = order_statistic_rank(np.full(R, n), p, gamma) + shift
    b, _ = kth_smallest_groups(x, r)
    return int(np.sum(b >= qtrue(p)))


@pytest.mark.parametrize("name", list(DISTS))
def test_order_statistic_coverage(name):
    """Small n (59 -> the maximum; 120 -> an inner order statistic): coverage of the true
    p-quantile must not be significantly below gamma (one-sided binomial test)."""
    sample, qtrue = DISTS[name]
    rng = np.random.default_rng(11)
    R = 1500
    for n in (59, 120):
        k = _os_coverage(sample, qtrue, n, 0.95, 0.95, R, rng)
        assert stats.binomtest(k, R, 0.95, alternative="less").pvalue > P_REJECT, (name, n, k / R)
    # the bound of the public wrapper equals the kernel's
    x = sample(rng, 200)
    b, r, nn = order_statistic_bound(x, 0.9, 0.9)
    assert b[0] == np.sort(x)[r[0] - 1] and nn[0] == 200


@pytest.mark.parametrize("name", ["abs_normal", "lognormal"])
def test_off_by_one_is_detected(name):
    """A rank one too small (r - 1) must fail the same coverage test: the harness has power.

    (Continuous distributions only: on a coarse lattice X_(r-1) often ties X_(r), so the
    lattice bound is conservative and an off-by-one can go unnoticed there.)"""
    sample, qtrue = DISTS[name]
    rng = np.random.default_rng(12)
    R = 1500
    k = _os_coverage(sample, qtrue, 59, 0.95, 0.95, R, rng, shift=-1)
    assert stats.binomtest(k, R, 0.95, alternative="less").pvalue < P_REJECT
    x = sample(rng, (4000, 20))
    new = sample(rng, 4000)
    r = conformal_rank(np.full(4000, 19), 0.1) - 1
    b, _ = kth_smallest_groups(x[:, :19], r)
    kk = int(np.sum(new <= b))
    assert stats.binomtest(kk, 4000, 0.9, alternative="less").pvalue < P_REJECT


@pytest.mark.parametrize("name", list(DISTS))
def test_conformal_coverage(name):
    """A fresh draw falls below the split-conformal bound with probability >= 1 - alpha."""
    sample, _ = DISTS[name]
    rng = np.random.default_rng(13)
    R = 4000
    for n, alpha in ((19, 0.1), (99, 0.01)):
        cal = sample(rng, (R, n))
        new = sample(rng, R)
        b, r, _ = conformal_bound(cal, alpha)
        k = int(np.sum(new <= b))
        assert stats.binomtest(k, R, 1 - alpha, alternative="less").pvalue > P_REJECT, (name, n, k / R)


def test_conformal_bound_edges():
    """Integer input gives a float64 bound; a group of one value is not empty; an all-NaN
    group is named; alpha is validated by name."""
    b, r, n = conformal_bound(list(range(1, 20)), 0.1)
    assert conformal_rank([99, 199], 0.01).dtype == np.int64 and r.dtype == np.int64
    assert b.dtype == np.float64 and b.tolist() == [18.0] and r.tolist() == [18] and n.tolist() == [19]
    b, r, n = conformal_bound(np.array([[3.0, np.nan], [1.0, 2.0]]), 0.5)  # min n for alpha 0.5 is 1
    assert b.tolist() == [3.0, 2.0] and n.tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"group 1 is empty \(or all NaN\)"):
        conformal_bound(np.array([[1.0, 2.0], [np.nan, np.nan]]), 0.5)
    with pytest.raises(ValueError, match="alpha must lie strictly between 0 and 1, got 1.5"):
        conformal_min_n(1.5)
    with pytest.raises(ValueError, match="alpha must lie strictly between 0 and 1, got 0.0"):
        conformal_rank(10, 0.0)
