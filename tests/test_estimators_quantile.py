"""Parity of the selection-based quantile / top-k kernels with numpy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tolstat.estimators import kth_smallest_groups, quantile, quantile_groups, topk, topk_groups

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
    with pytest.raises(ValueError):
        topk_groups(x, 0)
