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


# --------------------------------------------------------------------------- ranks and minimum n
# Ranks, minimum n and their errors against the binomial definitions.


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


def test_order_statistic_min_n_names_its_arguments_and_handles_n_one():
    from tolstat.models.estimators.orderstat import order_statistic_min_n

    with pytest.raises(ValueError, match="^p must lie strictly between 0 and 1, got 1.5"):
        order_statistic_min_n(1.5, 0.9)
    with pytest.raises(ValueError, match="^confidence must lie strictly between 0 and 1, got 1"):
        order_statistic_min_n(0.5, 1)
    assert order_statistic_min_n(0.1, 0.5) == 1  # 1 - 0.1 >= 0.5: one run suffices
    assert (order_statistic_min_n(0.95, 0.95), order_statistic_min_n(0.99, 0.95)) == (59, 299)


def _min_n_reference(p, g):
    """The documented definition: the smallest n >= 1 with 1 - p**n >= g (linear search)."""
    n = 1
    while 1.0 - p**n < g:
        n += 1
    return n


@pytest.mark.parametrize("p, g", [
    # g a few ulps above 1 - p**m: the closed-form start ceil(ln(1-g)/ln p - 1e-9) is m, one too low
    (0.5, 1.0 - 0.5**5 + 1e-15), (0.9, 1.0 - 0.9**20 + 1e-15), (0.99, 1.0 - 0.99**59 + 1e-15),
    # g = 1 - p**m near 1: ln(1-g) has lost digits and the start is m + 1, one too high
    (0.9, 1.0 - 0.9**144), (0.7, 1.0 - 0.7**53), (0.8, 1.0 - 0.8**76),
    # ordinary levels
    (0.95, 0.95), (0.99, 0.95), (0.5, 0.5),
])
def test_order_statistic_min_n_is_the_smallest_n_of_the_definition(p, g):
    assert order_statistic_min_n(p, g) == _min_n_reference(p, g)


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
