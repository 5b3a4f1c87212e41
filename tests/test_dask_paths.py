"""fit and select accept dask-backed error datasets and give the in-memory results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

import tolstat

pytest.importorskip("dask")


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    def make(rng):
        return tolstat.Inputs(args=(rng.standard_normal(64) * rng.choice([1.0, 10.0, 100.0]),),
                              labels={"kind": "x"})

    parts = [tolstat.collect(_kernel, _ref, make, op=op, dtype=dt, runs=300, hardware="h",
                             options=tolstat.CollectOptions(sample_size=64, progress=False), seed=i)
             for i, (op, dt) in enumerate([("mul3", "fp16"), ("mul3b", "fp16")])]
    ds = tolstat.concat(parts)
    path = tmp_path_factory.mktemp("dask") / "errors.zarr"
    tolstat.save(ds, path)
    return ds, path


@pytest.mark.parametrize("chunk", [7, 600])
@pytest.mark.parametrize("form", [None, "allclose", "size_aware"])
@pytest.mark.slow
def test_select_on_dask_equals_in_memory(stored, chunk, form):
    ds, path = stored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # chunks splitting stored chunks
        lazy = tolstat.open_errors(path, chunks={"run": chunk})
    assert lazy.sample_abs.chunks is not None
    opts = tolstat.SelectOptions(scale=tolstat.models.ScaleOptions(size_covariate="n_elements" if form else None))
    a = tolstat.select(ds, fp_budget=0.02, form=form, options=opts)
    b = tolstat.select(lazy, fp_budget=0.02, form=form, options=opts)
    da, db = a.data.copy(), b.data.copy()
    da.attrs.pop("provenance"), db.attrs.pop("provenance")  # creation time differs
    xr.testing.assert_identical(da, db)


@pytest.mark.parametrize("chunk", [5, 64])
@pytest.mark.parametrize("method,opts", [("order_statistic", {"p": 0.99, "confidence": 0.95}),
                                         ("empirical", {"p": [0.5, 0.99]}),
                                         ("conformal", {"alpha": 0.05})])
def test_fit_on_dask_equals_in_memory(stored, chunk, method, opts):
    ds, path = stored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lazy = tolstat.open_errors(path, chunks={"run": chunk})
    a = tolstat.fit(ds, method=method, **opts)
    b = tolstat.fit(lazy, method=method, chunks={"op": 1}, **opts).compute()
    np.testing.assert_array_equal(a.threshold.values, b.threshold.values)


def test_run_scores_blockwise_equals_whole(stored, monkeypatch):
    """Scores read RUN_BLOCK runs at a time equal those of one whole read."""
    from tolstat.models import scale, statistics

    ds, path = stored
    model = scale.fit_scale(ds.isel(run=slice(0, 300)), "allclose")
    whole = scale.run_scores(ds, model).scores
    monkeypatch.setattr(statistics, "RUN_BLOCK", 7)
    assert len(statistics.run_blocks(ds.sizes["run"])) == -(-ds.sizes["run"] // 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lazy = tolstat.open_errors(path, chunks={"run": 50})
    blocks = scale.run_scores(lazy, model).scores
    np.testing.assert_array_equal(whole, blocks)
    a, r, rows = scale._element_subsample(lazy, 500, np.random.default_rng(0))
    assert 450 <= a.size <= 550 and rows.max() < ds.sizes["run"]
    for k in range(0, a.size, 97):
        assert a[k] in ds.sample_abs.values[rows[k]]
