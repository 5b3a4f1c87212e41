"""Mutants of ``tolstat.estimators`` that the other tests do not kill (scipy/numpy references)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tolstat.estimators.evt import gev_return_level
from tolstat.estimators.quantile import topk_groups


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
