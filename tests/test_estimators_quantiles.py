"""Parity of the selection-based quantile / top-k kernels with numpy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tolstat.models.estimators import kth_smallest_groups, quantile, quantile_groups, topk, topk_groups

METHODS = ["linear", "lower", "higher", "nearest"]
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
# a small value pool forces ties
tied = st.sampled_from([0.0, 0.0, 1.0, 2.5, -3.0, 1e-300, 7.0])
probs = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 300), elements=finite), q=probs)
def test_quantile_bit_parity(x, q):
    for m in METHODS:
        np.testing.assert_array_equal(quantile(x, q, method=m), np.quantile(x, q, method=m))


@settings(max_examples=100, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 200), elements=tied), q=probs)
def test_quantile_parity_with_ties(x, q):
    for m in METHODS:
        np.testing.assert_array_equal(quantile(x, q, method=m), np.quantile(x, q, method=m))


@settings(max_examples=100, deadline=None)
@given(
    x=hnp.arrays(np.float64, st.integers(1, 200), elements=st.one_of(finite, st.just(np.nan))),
    q=probs,
)
def test_quantile_nan_omit_matches_nanquantile(x, q):
    valid = x[~np.isnan(x)]
    for m in METHODS:
        if valid.size == 0:
            with pytest.raises(ValueError, match="empty"):
                quantile(x, q, method=m, nan_policy="omit")
        else:
            np.testing.assert_array_equal(
                quantile(x, q, method=m, nan_policy="omit"), np.nanquantile(x, q, method=m)
            )


def test_quantile_inf_like_numpy():
    x = np.array([0.0, 1.0, np.inf, 2.0])
    q = [0.0, 0.5, 0.66, 0.9, 1.0]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(quantile(x, q), np.quantile(x, q))


def test_groups_nan_padded_many_probs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 501))
    lens = rng.integers(0, 502, 37)
    for i, k in enumerate(lens):
        x[i, k:] = np.nan
    q = np.array([0.0, 0.1, 0.5, 0.99, 0.999, 1.0])
    out, n = quantile_groups(x, q, method="linear")
    np.testing.assert_array_equal(n, lens)
    for i in range(37):
        if lens[i] == 0:
            assert np.all(np.isnan(out[i]))
        else:
            np.testing.assert_array_equal(out[i], np.quantile(x[i, : lens[i]], q))


def test_large_lattice_and_all_equal():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, 200_000).astype(float)
    np.testing.assert_array_equal(quantile(x, [0.5, 0.999]), np.quantile(x, [0.5, 0.999]))
    assert quantile(np.zeros(100_000), 0.999) == 0.0


def test_nan_policy_raise_and_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        quantile([1.0, np.nan], 0.5)
    with pytest.raises(ValueError, match="nan_policy"):
        quantile([1.0], 0.5, nan_policy="propagate")
    with pytest.raises(ValueError, match="method"):
        quantile([1.0], 0.5, method="hazen")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        quantile([1.0], 1.5)
    with pytest.raises(ValueError, match="empty"):
        quantile([], 0.5)


def test_topk_and_kth():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 50, (20, 300)).astype(float)
    x[3, 5:] = np.nan
    top, n = topk_groups(x, 10)
    for i in range(20):
        v = np.sort(x[i][~np.isnan(x[i])])[::-1][:10]
        np.testing.assert_array_equal(top[i, : v.size], v)
        assert np.all(np.isnan(top[i, v.size:]))
    # merging chunk top-k gives the global top-k
    a, b = x[0, :150], x[0, 150:]
    merged = topk(np.concatenate([topk(a, 10), topk(b, 10)]), 10)
    np.testing.assert_array_equal(merged, topk(x[0], 10))
    r = rng.integers(1, 301, 20)
    r[3] = 3
    vals, _ = kth_smallest_groups(x, r)
    for i in range(20):
        assert vals[i] == np.sort(x[i][~np.isnan(x[i])])[r[i] - 1]
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        topk_groups(x, 0)


# --------------------------------------------------------------------------- radix path
# Groups with >= quantile._RADIX_MIN_N values use the radix (ordered-key histogram)
# selection; these tests force it on small inputs (and force deep digit refinement with
# a tiny exact-selection cutoff) and compare with numpy bit for bit.
import contextlib
import importlib

_qmod = importlib.import_module("tolstat.models.estimators.quantiles")
special = st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -1e-310, 1.0, -1.0, 1.0 + 2**-52,
     1.0 - 2**-53, 3.0, -7.5, 1e300, -1e300, np.inf, -np.inf]
)
mixed = st.one_of(finite, tied, special, st.floats(allow_nan=False, width=64))


@contextlib.contextmanager
def radix_forced(small=0):
    """Route every group through the radix path, finishing buckets of <= ``small`` exactly."""
    saved = _qmod._RADIX_MIN_N, _qmod._RADIX_SMALL
    _qmod._RADIX_MIN_N, _qmod._RADIX_SMALL = 1, small
    try:
        yield
    finally:
        _qmod._RADIX_MIN_N, _qmod._RADIX_SMALL = saved


def _assert_numpy_parity(x, q, methods=METHODS):
    """Row-wise parity with numpy.(nan)quantile (values; NaN == NaN; -0.0 == +0.0)."""
    for m in methods:
        out, n = quantile_groups(x, q, method=m)
        for i in range(x.shape[0]):
            v = x[i][~np.isnan(x[i])]
            assert n[i] == v.size
            if v.size == 0:
                assert np.all(np.isnan(out[i]))
                continue
            with np.errstate(invalid="ignore"):
                ref = np.quantile(v, q, method=m)
            np.testing.assert_array_equal(out[i], ref, err_msg=f"method={m} row={i}")


@settings(max_examples=150, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 300), elements=mixed), q=probs,
       small=st.sampled_from([0, 3, 64]))
def test_radix_bit_parity_special_values(x, q, small):
    with radix_forced(small):
        _assert_numpy_parity(x[None, :], q)


@settings(max_examples=100, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 200), elements=tied), q=probs,
       small=st.sampled_from([0, 5]))
def test_radix_parity_with_ties(x, q, small):
    with radix_forced(small):
        _assert_numpy_parity(x[None, :], q)


@settings(max_examples=100, deadline=None)
@given(
    x=hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 120)),
                 elements=st.one_of(mixed, st.just(np.nan))),
    q=probs,
)
def test_radix_nan_omit_rows(x, q):
    with radix_forced():
        _assert_numpy_parity(x, q)


def test_radix_signed_zero_values():
    # -0.0 sorts just below +0.0 in key order: values equal numpy's (== compares zeros equal)
    x = np.array([[0.0, -0.0, 0.0, -0.0, 1.0, -1.0, -0.0]])
    for small in (0, 2, 100):
        with radix_forced(small):
            _assert_numpy_parity(x, np.linspace(0, 1, 13))


def test_radix_large_groups_default_cutoffs():
    # the default thresholds: large normal, uniform (one dominant top digit), lattice,
    # all-equal, subnormal-only and NaN-padded rows of unequal length
    rng = np.random.default_rng(5)
    n = 3 * _qmod._RADIX_MIN_N + 17
    rows = [
        rng.standard_normal(n),
        rng.uniform(1.0, 2.0, n),
        rng.uniform(0.0, 1.0, n),
        rng.integers(-2, 3, n).astype(float),
        np.full(n, -3.25),
        rng.integers(1, 50, n) * 5e-324,
        np.where(rng.random(n) < 0.01, np.inf, rng.exponential(1.0, n)),
        -np.abs(rng.standard_normal(n)),
    ]
    x = np.vstack(rows)
    x[0, n // 2:] = np.nan
    x[3, ::7] = np.nan
    q = [0.0, 1e-3, 0.25, 0.5, 0.5 + 1e-9, 0.9, 0.99, 0.999, 1.0]
    _assert_numpy_parity(x, q)
    x[2, :] = np.nan  # an all-NaN row among radix rows
    _assert_numpy_parity(x, q, methods=["linear"])


@pytest.mark.parametrize("q", [1e-6, 0.3, 0.9])
def test_pot_radix_kernel_matches_copying_kernel(q):
    # the long-row POT kernel selects the threshold by radix selection: same u, zeta and
    # n_exceed as the copying kernel; the MLE sees the exceedances in another order
    evt = importlib.import_module("tolstat.models.estimators.evt")
    rng = np.random.default_rng(7)
    n = 5000
    x = np.vstack([rng.exponential(1.0, n), np.abs(rng.standard_normal(n)),
                   rng.integers(0, 4, n).astype(float), np.full(n, 2.5), rng.pareto(3.0, n),
                   rng.uniform(0, 1, n), rng.integers(1, 9, n) * 5e-324])
    x[1, 3000:] = np.nan
    x[5, 10:] = np.nan
    for zs in (False, True):
        ref, n_ref = evt._pot_groups_kernel(x.copy(), 0.1, 30, q, zs, 4)
        for small in (0, 16, 512):
            got, n_got = evt._pot_groups_radix_kernel(x, x.view(np.int64), 0.1, 30, q, zs, 4, small)
            np.testing.assert_array_equal(n_got, n_ref)
            np.testing.assert_array_equal(got[:, [0, 3, 4]], ref[:, [0, 3, 4]])  # u, zeta, n_exceed
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=0, equal_nan=True)
            np.testing.assert_allclose(got[:, 5], ref[:, 5], rtol=1e-11, equal_nan=True)  # loglik


# --------------------------------------------------------------------------- predicted buckets
# Long groups gather, in their histogram pass, the buckets their predecessor needed; a
# group whose ranks fall elsewhere (or that overflows the gather buffer) re-reads itself.
@contextlib.contextmanager
def predict_forced(small=0):
    """Every group takes the radix path with bucket prediction, all groups in one block
    (so every group but the first is predicted from its predecessor)."""
    saved = _qmod._PREDICT_MIN_N, _qmod._nblocks
    _qmod._PREDICT_MIN_N, _qmod._nblocks = 1, lambda g: 1
    try:
        with radix_forced(small):
            yield
    finally:
        _qmod._PREDICT_MIN_N, _qmod._nblocks = saved


@settings(max_examples=100, deadline=None)
@given(
    x=hnp.arrays(np.float64, st.tuples(st.integers(2, 9), st.integers(1, 150)),
                 elements=st.one_of(mixed, st.just(np.nan))),
    q=probs,
    small=st.sampled_from([0, 4, 64]),
)
def test_predicted_buckets_bit_parity(x, q, small):
    with predict_forced(small):
        _assert_numpy_parity(x, q)


def test_predicted_buckets_alike_and_unlike_groups():
    # groups drawn alike (predictions hit), then shifted, scaled, tied, NaN-padded and
    # tiny groups in between (predictions miss or do not apply): all equal numpy
    rng = np.random.default_rng(9)
    n = 40_000
    rows = [rng.standard_normal(n) for _ in range(6)]
    rows += [rng.standard_normal(n) + 50.0, rng.standard_normal(n) * 1e-6, rng.integers(-2, 3, n).astype(float),
             np.abs(rng.standard_normal(n)), rng.standard_normal(n), rng.uniform(1.0, 2.0, n),
             rng.standard_normal(n), -np.abs(rng.standard_normal(n))]
    x = np.vstack(rows)
    x[4, n // 3:] = np.nan
    x[9, 5:] = np.nan  # fewer values than the radix path needs
    x[12, :] = np.nan
    x[3, ::11] = np.inf
    q = [0.0, 0.001, 0.5, 0.9, 0.99, 0.999, 1.0]
    _assert_numpy_parity(x, q)
    with predict_forced(small=16):
        _assert_numpy_parity(x, q, methods=["linear", "nearest"])
    saved = _qmod._PREDICT_MIN_N
    _qmod._PREDICT_MIN_N = -1  # prediction off: the same numbers
    try:
        off = quantile_groups(x, q)[0]
    finally:
        _qmod._PREDICT_MIN_N = saved
    np.testing.assert_array_equal(quantile_groups(x, q)[0], off)


# --------------------------------------------------------------------------- k = 1, NaN errors, integers
# Top-k with k = 1, NaN errors, integer values.


def test_topk_groups_k_equal_one_is_the_group_max():
    x = np.array([[3.0, np.nan, 7.0, 1.0], [np.nan, np.nan, -2.0, -5.0]])
    top, n = topk_groups(x, 1)
    np.testing.assert_array_equal(top, [[7.0], [-2.0]])
    np.testing.assert_array_equal(n, [3, 2])
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        topk_groups(x, 0)


def test_nan_error_names_the_first_group_with_a_nan():
    from tolstat.models.estimators.quantiles import quantile_groups

    x = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, np.nan, 3.0], [np.nan, 1.0, 2.0]])
    with pytest.raises(ValueError, match=r"input contains NaN \(first in group 2\)"):
        quantile_groups(x, [0.5], nan_policy="raise")


def test_quantiles_of_integer_values_are_numpy_quantiles():
    from tolstat.models.estimators.quantiles import quantile_groups

    x = np.array([[3, 1, 2, 5, 8], [10, 0, 7, 7, 1]])
    q, n = quantile_groups(x, [0.3, 0.5, 0.9])
    np.testing.assert_array_equal(q, np.quantile(x.astype(np.float64), [0.3, 0.5, 0.9], axis=1).T)
    assert q.dtype == np.float64 and n.tolist() == [5, 5]
