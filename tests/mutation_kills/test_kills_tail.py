"""Mutants of ``tolstat.models.estimators.tail`` that the other tests do not kill (numpy references)."""

from __future__ import annotations

import numpy as np
import pytest

import tolstat
from tolstat.models.estimators.tail import group_topk, topk_order_statistic_bound, upper_quantile


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("p", [0.9, 0.97, np.float64(0.97), 1.0])
def test_upper_quantile_bit_for_bit_with_numpy_on_both_lerp_branches(dt, p):
    # (n - 1) p = 32.4 uses numpy's a + (b - a) t branch; 34.92 its b - (b - a)(1 - t)
    # branch, which differs from the first in the last bit for a few hundred of these rows
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4000, 37)) * rng.uniform(0.1, 1e3, (4000, 1))).astype(dt)
    top = -np.sort(-x, axis=1)[:, :8]
    got = upper_quantile(top, 37, p)
    ref = np.quantile(x, p, axis=1)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


def test_upper_quantile_rejects_levels_outside_the_unit_interval():
    top = np.array([[3.0, 2.0, 1.0]])
    assert upper_quantile(top, 3, 1.0)[0] == 3.0
    for p in (1.5, 2.0, -0.1):
        with pytest.raises(ValueError, match=r"p must lie in \[0, 1\], got"):
            upper_quantile(top, 3, p)


def _topk():
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(30):
        e = rng.standard_normal(16)
        pairs.append((e.astype(np.float32), e))
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32")
    return ds, group_topk(ds, "max_abs", 5)


def test_results_of_group_topk_carry_group_coordinates_not_the_rank():
    ds, t = _topk()
    assert "rank" in t.coords
    q = upper_quantile(t, p=0.95)
    assert set(q.coords) == {"op", "dtype", "hardware", "n"}
    ref = np.quantile(np.asarray(ds["max_abs"].values, dtype=np.float64), 0.95)
    assert float(q.values.ravel()[0]) == ref
    b = topk_order_statistic_bound(t, p=0.9, confidence=0.5)
    assert set(b.coords) == {"op", "dtype", "hardware", "n", "order_rank"}


def test_group_topk_of_samples_chunked_along_both_dims_equals_in_memory():
    pytest.importorskip("dask")
    ds, _ = _topk()
    mem = group_topk(ds, "sample_abs", 7)
    lazy = group_topk(ds.chunk({"run": 4, "sample": 5}), "sample_abs", 7)
    np.testing.assert_array_equal(lazy.values, mem.values)
    assert lazy["n"].dtype == np.int64 and int(lazy["n"].item()) == int(mem["n"].item())
    ref = np.sort(ds["sample_abs"].values[~np.isnan(ds["sample_abs"].values)])[::-1][:7]
    np.testing.assert_array_equal(mem.values.ravel(), ref)


def test_group_topk_name_and_attributes():
    ds, t = _topk()
    assert t.name == "max_abs"
    assert t.attrs == {"statistic": "max_abs", "k": 5, "long_name": "top-5 of max_abs per group"}
    anon = group_topk(ds, ds["max_abs"].rename(None), 3)
    assert anon.name == "statistic" and anon.attrs["statistic"] == "statistic"
    assert anon.attrs["long_name"] == "top-3 of statistic per group"


def test_group_topk_of_a_statistic_with_run_not_first():
    ds, _ = _topk()
    a = group_topk(ds, "sample_abs", 6)
    b = group_topk(ds, ds["sample_abs"].transpose("sample", "run"), 6)
    np.testing.assert_array_equal(a.values, b.values)


def test_group_topk_keeps_dask_input_blockwise(monkeypatch):
    pytest.importorskip("dask")
    from tolstat.models.estimators import tail

    calls = []
    real = tail._dask_topk
    monkeypatch.setattr(tail, "_dask_topk", lambda *a, **k: calls.append(1) or real(*a, **k))
    ds, t = _topk()
    lazy = group_topk(ds.chunk({"run": 7}), "max_abs", 5)
    assert calls == [1]  # the out-of-core merge tree, not an in-memory copy of the whole array
    np.testing.assert_array_equal(lazy.values, t.values)
    group_topk(ds, "max_abs", 5)
    assert calls == [1]  # in-memory input: not through dask
