"""``fit(method="gpd")`` of long groups in one read, and group values kept as a view.

A long group (at least ``_POT_RADIX_MIN_N`` values) is read once: the counts, the checks
for negative and infinite values, the maximum and the values above a threshold predicted
from a strided sample. The fit must equal the two-read kernel's (the same threshold,
exceedances, ``zeta`` and fallback quantile; the likelihood summed in another order),
also where the prediction fails and the row is read again.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tolstat.models.estimators import evt
from tolstat.models.estimators import fit, group_values

RUNS, WIDTH = 20, 4096  # 81,920 values per group: the one-read path


def _dataset(rows: dict[tuple[str, str], np.ndarray]) -> xr.Dataset:
    """An error dataset whose groups are the rows given, in the order given (runs of WIDTH)."""
    samp, ops, dts = [], [], []
    for (op, dt), x in rows.items():
        x = np.asarray(x, dtype=np.float64).reshape(-1, WIDTH)
        samp.append(x)
        ops += [op] * x.shape[0]
        dts += [dt] * x.shape[0]
    s = np.concatenate(samp)
    return xr.Dataset({"sample_abs": (("run", "sample"), s), "max_abs": ("run", np.nanmax(s, axis=1))},
                      coords={"op": ("run", ops), "dtype": ("run", dts), "hardware": ("run", ["cpu"] * len(ops))})


def _two_read(x: np.ndarray, q: float, zs: int = 0) -> np.ndarray:
    """The POT fit of one row by the kernels the one-read path replaces."""
    return evt._pot_groups_rescaled(np.ascontiguousarray(x[None, :]), q, 0.1, 30, zs)[0][0]


def _assert_same_fit(got: np.ndarray, ref: np.ndarray) -> None:
    cols = [evt.POT_FIELDS.index(c) for c in ("u", "zeta", "n_exceed")]
    np.testing.assert_array_equal(got[cols], ref[cols])
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=0, equal_nan=True)


def _fit_row(out: xr.Dataset, op: str, dt: str) -> np.ndarray:
    g = out.sel(op=op, dtype=dt, hardware="cpu")
    return np.array([float(g[("threshold" if f == "return_level" else f)]) for f in evt.POT_FIELDS])


def _rows(seed: int = 0) -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(seed)
    n = RUNS * WIDTH
    return {  # dataset order: float16 before bfloat16, so the labels are not sorted
        ("op0", "float16"): rng.exponential(1e-3, n),
        ("op0", "bfloat16"): np.abs(rng.standard_t(3.0, n)),
        ("op1", "float16"): rng.integers(0, 40, n) * 2.0 ** -11,  # a lattice: ties at the threshold
        ("op1", "bfloat16"): rng.pareto(2.5, n) * 1e-250,  # far from 1: fitted rescaled
    }


@pytest.mark.parametrize("q", [1e-9, 0.3])
def test_gpd_fit_of_long_groups_equals_the_two_read_kernel(q):
    rows = _rows()
    ds = _dataset(rows)
    out = fit(ds, method="gpd", statistic="sample_abs", q=q)
    assert list(out.dtype.values) == ["bfloat16", "float16"]  # sorted, as for any dataset order
    for (op, dt), x in rows.items():
        _assert_same_fit(_fit_row(out, op, dt), _two_read(x, q))
        assert int(out.n.sel(op=op, dtype=dt, hardware="cpu")) == x.size


def test_gpd_fit_equals_the_dask_path_that_reads_twice():
    ds = _dataset(_rows(1))
    a = fit(ds, method="gpd", statistic="sample_abs", q=1e-6)
    b = fit(ds, method="gpd", statistic="sample_abs", q=1e-6, chunks={"dtype": 1})
    for v in ("u", "zeta", "n_exceed"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    np.testing.assert_allclose(a.threshold.values, b.threshold.values, rtol=1e-9)


def test_a_tail_the_strided_sample_misses_is_read_again():
    n = RUNS * WIDTH
    step = n // evt._POT_SAMPLE
    rng = np.random.default_rng(2)
    x = rng.exponential(1.0, n)
    under = x.copy()
    under[::step] = 1e-9  # the sample sees only tiny values: nearly every value is gathered
    over = rng.exponential(1e-3, n)
    over[::step] = 5.0 + rng.random(over[::step].size)  # the sample sees only large values: too few gathered
    grid = np.vstack([under, over])
    nvalid, nneg, ninf, mx, buf, ngath = evt.pot_one_read(grid, 0.1)
    assert ngath[0] == -1  # more than the buffer holds
    _, status = evt._pot_gathered_kernel(buf, ngath, nvalid, 0.1, 30, 1e-9, False, 2)
    assert list(status) == [1, 1]
    out = fit(_dataset({("a", "float16"): under, ("b", "float16"): over}), method="gpd", statistic="sample_abs",
              q=1e-9)
    _assert_same_fit(_fit_row(out, "a", "float16"), _two_read(under, 1e-9))
    _assert_same_fit(_fit_row(out, "b", "float16"), _two_read(over, 1e-9))


def test_one_read_counts_nan_negative_and_infinite_values():
    x = np.random.default_rng(3).exponential(1.0, (3, 70_000))
    x[0, :500] = np.nan
    x[1, 7] = -1.0
    x[2, 9] = np.inf
    nvalid, nneg, ninf, mx, _, _ = evt.pot_one_read(x, 0.1)
    assert list(nvalid) == [69_500, 70_000, 70_000]
    assert list(nneg) == [0, 1, 0] and list(ninf) == [0, 0, 1]
    np.testing.assert_array_equal(mx, [np.nanmax(x[0]), np.max(x[1]), np.inf])


def test_gpd_fit_of_long_groups_refuses_negative_and_infinite_values():
    n = RUNS * WIDTH
    x = np.random.default_rng(4).exponential(1.0, n)
    neg, inf = x.copy(), x.copy()
    neg[123] = -0.5
    inf[456] = np.inf
    with pytest.raises(ValueError, match="sample_abs has negative values"):
        fit(_dataset({("a", "float16"): neg}), method="gpd", statistic="sample_abs")
    with pytest.raises(ValueError, match="sample_abs has infinite values"):
        fit(_dataset({("a", "float16"): inf}), method="gpd", statistic="sample_abs")


def test_group_values_in_dataset_order_are_a_view_and_fits_are_sorted():
    rows = _rows(5)
    ds = _dataset(rows)
    da, present = group_values(ds, "sample_abs", sort=False)
    assert list(da["dtype"].values) == ["float16", "bfloat16"]
    assert np.shares_memory(da.values, ds.sample_abs.values)
    srt, _ = group_values(ds, "sample_abs")
    assert list(srt["dtype"].values) == ["bfloat16", "float16"]
    xr.testing.assert_equal(da.sortby(["op", "dtype"]), srt)
    emp = fit(ds, method="empirical", statistic="sample_abs", p=[0.5, 0.999])
    for (op, dt), x in rows.items():
        np.testing.assert_array_equal(emp.threshold.sel(op=op, dtype=dt, hardware="cpu").values,
                                      np.quantile(x, [0.5, 0.999]))
