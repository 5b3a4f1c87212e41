"""Exact group top-k on in-memory and dask-backed data; upper quantiles and order-statistic bounds."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings, strategies as st
from scipy import stats

import tolstat
from tolstat.models.estimators import tail
from tolstat.models.estimators import order_statistic_min_n
from tolstat.models.estimators.tail import group_topk, topk_order_statistic_bound, upper_quantile

dask = pytest.importorskip("dask")


def _table(nrun: int = 37, nsample: int = 11, seed: int = 0, dtype=np.float64) -> xr.Dataset:
    """A small error table: 3 ops x 2 dtypes, unsorted runs, NaN padding, ties, inf, -0."""
    rng = np.random.default_rng(seed)
    ops = rng.choice(["matmul", "softmax", "conv"], nrun)
    dts = rng.choice(["float16", "float32"], nrun)
    s = np.round(rng.exponential(1.0, (nrun, nsample)), 1).astype(dtype)  # rounding -> ties
    ns = rng.integers(1, nsample + 1, nrun)
    s[np.arange(nsample)[None, :] >= ns[:, None]] = np.nan
    s[rng.random(s.shape) < 0.01] = np.inf
    s[0, 0] = -0.0
    mx = np.nanmax(s, axis=1)
    return xr.Dataset(
        {"sample_abs": (("run", "sample"), s), "max_abs": ("run", mx.astype(np.float64)),
         "n_sample": ("run", ns)},
        coords={"op": ("run", ops), "dtype": ("run", dts),
                "hardware": ("run", np.array(["cpu:x"] * nrun))},
    )


def _full_groups(ds, statistic, by=tolstat.dataset.schema.GROUP_DIMS):
    """Reference: every group's non-NaN values, by brute force."""
    v = ds[statistic].values.reshape(ds.sizes["run"], -1)
    keys = list(zip(*(ds[b].values for b in by)))
    out: dict = {}
    for i, key in enumerate(keys):
        x = v[i][~np.isnan(v[i])]
        out.setdefault(key, []).append(x)
    return {key: np.concatenate(x) for key, x in out.items()}


CHUNKINGS = [1, 2, 5, 7, 16, 37, (3, 10, 1, 20, 3)]


@pytest.mark.parametrize("statistic", ["sample_abs", "max_abs"])
@pytest.mark.parametrize("k", [1, 4, 500])
def test_topk_matches_brute_force(statistic, k):
    ds = _table()
    top = tail.group_topk(ds, statistic, k)
    assert top.dims == ("op", "dtype", "hardware", "rank")
    full = _full_groups(ds, statistic)
    for (op, dt, hw), x in full.items():
        t = top.sel(op=op, dtype=dt, hardware=hw)
        assert int(t.n) == x.size
        expect = np.sort(x)[::-1][:k]
        got = t.values[: min(k, x.size)]
        np.testing.assert_array_equal(got, expect)
        assert np.isnan(t.values[min(k, x.size):]).all()


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("statistic", ["sample_abs", "max_abs"])
def test_dask_equals_memory(chunks, statistic):
    ds = _table()
    mem = tail.group_topk(ds, statistic, 6)
    lazy = ds.chunk({"run": chunks})
    assert lazy[statistic].chunks is not None
    got = tail.group_topk(lazy, statistic, 6, split_every=2)
    xr.testing.assert_identical(mem, got)
    # bit-for-bit, including the sign of zeros
    assert mem.values.tobytes() == got.values.tobytes()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), nrun=st.integers(1, 40), chunk=st.integers(1, 40),
       k=st.integers(1, 30))
def test_dask_equals_memory_hypothesis(seed, nrun, chunk, k):
    ds = _table(nrun=nrun, nsample=5, seed=seed)
    mem = tail.group_topk(ds, "sample_abs", k)
    got = tail.group_topk(ds.chunk({"run": chunk}), "sample_abs", k, split_every=3)
    assert mem.values.tobytes() == got.values.tobytes()
    np.testing.assert_array_equal(mem.n.values, got.n.values)


def test_topk_from_zarr_store(tmp_path):
    ds = tolstat.collect(
        lambda a: (a.astype(np.float16) * np.float16(3)).astype(np.float16),
        lambda a: a.astype(np.float16).astype(np.float64) * 3,
        lambda rng: (rng.standard_normal(50),), op="scale", dtype="float16", runs=9,
        hardware="t", seed=1, options=tolstat.CollectOptions(sample_size=16))
    path = tolstat.save(ds, tmp_path / "e.zarr")
    lazy = tolstat.open_errors(path, chunks={"run": 2})
    for stat in ("sample_abs", "sample_ulp", "max_abs"):
        a = tail.group_topk(ds, stat, 20)
        b = tail.group_topk(lazy, stat, 20)
        xr.testing.assert_identical(a, b)


def test_absent_combinations_and_by():
    ds = _table()
    ds["op"] = ("run", np.where(ds.dtype.values == "float16", "matmul", "conv"))
    top = tail.group_topk(ds, "max_abs", 3)
    assert int(top.n.sel(op="matmul", dtype="float32", hardware="cpu:x")) == 0
    assert np.isnan(top.sel(op="matmul", dtype="float32").values).all()
    one = tail.group_topk(ds, "max_abs", 3, by=["dtype"])
    assert one.dims == ("dtype", "rank")
    assert int(one.n.sum()) == ds.sizes["run"]


def test_errors():
    ds = _table()
    with pytest.raises(ValueError, match="k must be"):
        tail.group_topk(ds, "max_abs", 0)
    with pytest.raises(ValueError, match="not in the dataset"):
        tail.group_topk(ds, "max_abs", 2, by=["nope"])
    with pytest.raises(ValueError, match="'run'"):
        tail.group_topk(ds.assign(q=("x", [1.0])), "q", 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["linear", "higher"])
def test_upper_quantile_bit_for_bit(dtype, method):
    rng = np.random.default_rng(1)
    for n in [1, 2, 3, 10, 101, 1000, 4097]:
        x = rng.lognormal(0, 2, n).astype(dtype)
        x[rng.random(n) < 0.1] = x[0]  # ties
        k = max(1, n // 7)
        top = np.sort(x)[::-1][:k]
        for p in [1.0, 0.999, 0.99, 1 - k / n, 1 - (k - 1) / n, 0.95, 0.9]:
            lo = np.floor((n - 1) * p) if method == "linear" else np.ceil((n - 1) * p)
            if n - lo > k:  # the order statistics np.quantile uses are not all in the top-k
                with pytest.raises(ValueError, match="k >="):
                    tail.upper_quantile(top, n, p, method=method)
                continue
            for pp in (p, np.float64(p)):  # python float and numpy scalar promote differently
                want = np.quantile(x, pp, method=method)
                got = tail.upper_quantile(top, n, pp, method=method)
                assert got.dtype == np.asarray(want).dtype, (n, pp)
                assert got.tobytes() == np.asarray(want).tobytes(), (n, pp, got, want)


def test_upper_quantile_grouped_and_dask():
    ds = _table(nrun=60, nsample=30)
    k = 40
    top = tail.group_topk(ds.chunk({"run": 7}), "sample_abs", k)
    full = _full_groups(ds, "sample_abs")
    q = tail.upper_quantile(top, p=0.9, method="higher")
    ql = tail.upper_quantile(top, p=0.95)
    for (op, dt, hw), x in full.items():
        assert float(q.sel(op=op, dtype=dt, hardware=hw)) == np.quantile(x, 0.9, method="higher")
        want = np.quantile(x, 0.95)
        got = float(ql.sel(op=op, dtype=dt, hardware=hw))
        assert got == want or (np.isnan(got) and np.isnan(want))


def test_order_statistic_bound_exact():
    rng = np.random.default_rng(2)
    x = rng.exponential(1.0, 5000)
    top = np.sort(x)[::-1][:200]
    for p, g in [(0.99, 0.95), (0.999, 0.9), (0.98, 0.99)]:
        r = int(tail.topk_order_statistic_rank(x.size, p, g))
        assert stats.binom.cdf(r - 1, x.size, p) >= g > stats.binom.cdf(r - 2, x.size, p)
        assert float(tail.topk_order_statistic_bound(top, x.size, p, g)) == np.sort(x)[r - 1]
    # the sample maximum at the minimum n
    nmin = tolstat.models.estimators.order_statistic_min_n(0.95, 0.95)
    assert nmin == 59
    assert float(tail.topk_order_statistic_bound(np.array([3.0, 2.0]), nmin, 0.95, 0.95)) == 3.0


def test_order_statistic_bound_errors_and_groups():
    with pytest.raises(ValueError, match="need n >= 59"):
        tail.topk_order_statistic_bound(np.array([3.0, 2.0]), 58, 0.95, 0.95)
    with pytest.raises(ValueError, match="k >= "):
        tail.topk_order_statistic_bound(np.array([3.0, 2.0]), 5000, 0.99, 0.95)
    ds = _table(nrun=400, nsample=30)
    top = tail.group_topk(ds, "sample_abs", 100)
    b = tail.topk_order_statistic_bound(top, p=0.99, confidence=0.9)
    assert set(b.coords) >= {"n", "order_rank", "op", "dtype", "hardware"}
    full = _full_groups(ds, "sample_abs")
    for (op, dt, hw), x in full.items():
        sel = b.sel(op=op, dtype=dt, hardware=hw)
        assert float(sel) == np.sort(x)[int(sel.order_rank) - 1]


def test_rank_is_the_binomial_rule_with_empty_groups():
    """tail.topk_order_statistic_rank against the definition, by brute force over all ranks with
    scipy: the smallest r with binom.cdf(r - 1, n, p) >= confidence; empty groups give 0."""
    n = np.array([[59, 0, 100], [1000, 12345, 0]])
    for p, g in [(0.95, 0.95), (0.9, 0.99), (0.99, 0.9)]:
        want = np.zeros(n.shape, dtype=np.int64)
        for idx, ni in np.ndenumerate(n):
            if ni == 0 or ni < order_statistic_min_n(p, g):
                continue
            r = np.arange(1, ni + 1)
            want[idx] = r[stats.binom.cdf(r - 1, ni, p) >= g][0]
        if (want[n > 0] == 0).any():
            with pytest.raises(ValueError, match="need n >= "):
                tail.topk_order_statistic_rank(n, p, g)
            continue
        got = tail.topk_order_statistic_rank(n, p, g)
        assert got.shape == n.shape and got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1"):
        tail.topk_order_statistic_rank(np.zeros(3, np.int64), 0.9, 1.5)  # validated even with no group


# --------------------------------------------------------------------------- upper_quantile and group_topk
# Numpy parity, coordinates, names, dask paths.


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
    calls = []
    real = tail._dask_topk
    monkeypatch.setattr(tail, "_dask_topk", lambda *a, **k: calls.append(1) or real(*a, **k))
    ds, t = _topk()
    lazy = group_topk(ds.chunk({"run": 7}), "max_abs", 5)
    assert calls == [1]  # the out-of-core merge tree, not an in-memory copy of the whole array
    np.testing.assert_array_equal(lazy.values, t.values)
    group_topk(ds, "max_abs", 5)
    assert calls == [1]  # in-memory input: not through dask


def test_group_topk_of_float32_values_chunked_keeps_float32():
    pytest.importorskip("dask")
    rng = np.random.default_rng(0)
    pairs = [(e.astype(np.float32), e) for e in rng.standard_normal((30, 16))]
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32")
    s32 = ds["max_abs"].astype(np.float32)
    lazy = group_topk(ds, s32.chunk({"run": 4}), 5)  # 8 blocks: merged by selection
    assert lazy.dtype == np.float32
    ref = np.sort(s32.values)[::-1][:5]
    np.testing.assert_array_equal(lazy.values.ravel(), ref)


def test_upper_quantile_of_a_topk_array_without_n_coordinate():
    rng = np.random.default_rng(9)
    x = [rng.exponential(size=200), rng.exponential(size=150)]
    k = 8
    top = np.stack([np.sort(v)[::-1][:k] for v in x])
    da = xr.DataArray(top, dims=("group", "rank"), coords={"group": ["a", "b"]})  # no 'n'
    got = upper_quantile(da, n=[200, 150], p=0.99, method="higher")
    np.testing.assert_array_equal(got.values, [np.quantile(v, 0.99, method="higher") for v in x])
    assert got.coords["n"].values.tolist() == [200, 150]
