"""The option objects of collect / from_pairs: CollectOptions and Store, and their validation."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

import tolstat
from tolstat.dataset import Store
from tolstat.dataset.options import CollectOptions


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _make(rng):
    return (rng.standard_normal(16),)


KW = dict(op="mul3", dtype="float16", runs=3, hardware="cpu")


def test_front_door_and_namespace():
    assert tolstat.CollectOptions is CollectOptions
    assert "CollectOptions" in tolstat.__all__ and "collect_to_store" not in tolstat.__all__
    assert not hasattr(tolstat, "collect_to_store")
    assert tolstat.dataset.Store is Store and "Store" in tolstat.dataset.__all__
    assert not hasattr(tolstat.dataset.stream, "collect_to_store")


@pytest.mark.parametrize("fn", [tolstat.collect, tolstat.from_pairs])
def test_public_collection_functions_take_at_most_ten_parameters(fn):
    assert len(inspect.signature(fn).parameters) <= 10


def test_defaults():
    o = CollectOptions()
    assert (o.labels, o.covariates, o.sample_size, o.rel_floor, o.allow_nan, o.magnitude, o.rowwise,
            o.progress) == (None, None, 320, None, False, None, False, None)
    s = Store("runs.zarr")
    assert (s.chunk_runs, s.chunks, s.overwrite) == (1024, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.sample_size = 3  # type: ignore[misc]


@pytest.mark.parametrize("kw,exc,match", [
    (dict(sample_size=-3), ValueError, r"CollectOptions.sample_size must be a positive integer, got -3"),
    (dict(sample_size=0), ValueError, r"CollectOptions.sample_size must be a positive integer, got 0"),
    (dict(sample_size=2.5), TypeError, r"CollectOptions.sample_size must be a positive integer, got 2.5 \(float\)"),
    (dict(sample_size=True), TypeError, r"CollectOptions.sample_size must be a positive integer, got True"),
    (dict(labels=["dist"]), TypeError, r"CollectOptions.labels must be a mapping \{name: value\} or None, got \['dist'\]"),
    (dict(covariates=3.0), TypeError, r"CollectOptions.covariates must be a mapping .* got 3.0"),
    (dict(rel_floor=-1.0), ValueError, r"CollectOptions.rel_floor must be finite and >= 0, got -1.0"),
    (dict(rel_floor=float("nan")), ValueError, r"CollectOptions.rel_floor must be finite and >= 0, got nan"),
    (dict(rel_floor="1e-3"), TypeError, r"CollectOptions.rel_floor must be a real number or None, got '1e-3'"),
    (dict(allow_nan="yes"), TypeError, r"CollectOptions.allow_nan must be True or False, got 'yes'"),
    (dict(magnitude="abs"), ValueError, r"CollectOptions.magnitude must be a callable, 'ref' or None, got 'abs'"),
    (dict(magnitude=np.ones(3)), ValueError, r"CollectOptions.magnitude must be a callable, 'ref' or None"),
    (dict(rowwise=1), TypeError, r"CollectOptions.rowwise must be True or False, got 1 \(int\)"),
    (dict(progress="no"), TypeError, r"CollectOptions.progress must be True, False or None, got 'no'"),
])
def test_collect_options_validation(kw, exc, match):
    with pytest.raises(exc, match=match):
        CollectOptions(**kw)


@pytest.mark.parametrize("args,kw,exc,match", [
    ((3,), {}, TypeError, r"Store.path must be a str or path-like, got 3 \(int\)"),
    (("runs.nc",), {}, ValueError, r"Store.path must be a zarr directory ending in '.zarr', got 'runs.nc'"),
    (("r.zarr",), dict(chunk_runs=0), ValueError, r"Store.chunk_runs must be a positive integer, got 0"),
    (("r.zarr",), dict(chunk_runs=1.5), TypeError, r"Store.chunk_runs must be a positive integer, got 1.5"),
    (("r.zarr",), dict(chunks=[4]), TypeError, r"Store.chunks must be None, 'auto', an int or a mapping"),
    (("r.zarr",), dict(overwrite=None), TypeError, r"Store.overwrite must be True or False, got None"),
])
def test_store_validation(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        Store(*args, **kw)


def test_store_accepts_paths():
    assert Store(Path("x") / "r.ZARR").path == Path("x") / "r.ZARR"
    assert Store("r.zarr", chunks={"run": 8}, overwrite=True).chunks == {"run": 8}


def test_collect_refuses_wrong_option_objects(tmp_path):
    with pytest.raises(TypeError, match=r"options must be a tolstat.CollectOptions or None, got \{'sample_size': 8\}"):
        tolstat.collect(_kernel, _ref, _make, **KW, options={"sample_size": 8})
    with pytest.raises(TypeError, match=r"store must be a path \(str or path-like\), a tolstat.dataset.Store or None, got 3"):
        tolstat.collect(_kernel, _ref, _make, **KW, store=3)
    with pytest.raises(ValueError, match="ending in '.zarr'"):
        tolstat.collect(_kernel, _ref, _make, **KW, store=tmp_path / "x.nc")
    with pytest.raises(TypeError, match="options must be a tolstat.CollectOptions"):
        tolstat.from_pairs([(np.float16([1.0]), np.array([1.0]))], op="x", dtype="float16",
                           options=Store("r.zarr"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'sample_size'"):
        tolstat.collect(_kernel, _ref, _make, **KW, sample_size=8)  # moved into CollectOptions
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tolstat.collect(_kernel, _ref, _make, **KW, store=tmp_path / "nope" / "r.zarr")


def test_from_pairs_takes_only_ref_as_magnitude():
    pairs = [(np.float16([1.0, 2.0]), np.array([1.0, 2.0]))]
    with pytest.raises(ValueError, match=r"from_pairs: CollectOptions.magnitude must be None or 'ref'"):
        tolstat.from_pairs(pairs, op="x", dtype="float16", options=CollectOptions(magnitude=np.abs))
    ds = tolstat.from_pairs(pairs, op="x", dtype="float16", options=CollectOptions(magnitude="ref"))
    assert "op_max" in ds


def test_options_reach_the_dataset(tmp_path):
    opts = CollectOptions(labels={"dist": "normal"}, covariates={"K": 16}, sample_size=4, progress=False)
    ds = tolstat.collect(_kernel, _ref, _make, **KW, options=opts)
    assert ds.sizes["sample"] == 4 and ds.attrs["sample_size"] == 4
    assert ds["dist"].values.tolist() == ["normal"] * 3 and ds["K"].values.tolist() == [16.0] * 3
    streamed = tolstat.collect(_kernel, _ref, _make, **KW, options=opts,
                               store=Store(tmp_path / "s.zarr", chunks={"run": 3}))
    assert streamed.chunks["run"] == (3,)  # dask-backed, as Store.chunks asks
    np.testing.assert_array_equal(streamed["max_abs"].values, ds["max_abs"].values)
    # a plain path is Store(path): the finished store opens in memory
    again = tolstat.collect(_kernel, _ref, _make, **KW, options=opts, store=str(tmp_path / "s.zarr"))
    assert not again.chunks
