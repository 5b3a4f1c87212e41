"""Error dataset: collection, schema validation, concat, IO round trips and atomicity."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.dataset import io as tio


def _kernel(a, b):
    return (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float16)


def _reference(a, b):
    return a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)


def _make(rng):
    k = int(rng.choice([8, 33, 128]))
    return tolstat.Inputs(
        args=(rng.standard_normal((16, k)), rng.standard_normal((k, 24))),
        labels={"dist": "normal"},
        covariates={"K": k},
    )


@pytest.fixture(scope="module")
def small_ds():
    return tolstat.collect(_kernel, _reference, _make, op="matmul", dtype="fp16", runs=12,
                           hardware="test-cpu", seed=3, options=tolstat.CollectOptions(sample_size=64))


def test_collect_structure(small_ds):
    ds = small_ds
    tolstat.dataset.validate(ds)
    assert ds.sizes["run"] == 12 and ds.sizes["sample"] == 64
    assert set(np.unique(ds.op.values)) == {"matmul"}
    assert set(np.unique(ds.dtype.values)) == {"float16"}
    assert set(np.unique(ds.hardware.values)) == {"test-cpu"}
    assert ds.attrs["labels"] == "dist"
    assert "K" in ds.attrs["covariates"].split(",")
    assert (ds.n_elements == 16 * 24).all()
    # the run maximum is always in the sample
    np.testing.assert_array_equal(ds.sample_abs.max("sample").values, ds.max_abs.values)
    # recompute one run by hand
    rng = np.random.default_rng([3, 5])
    inp = _make(rng)
    m = tolstat.error_metrics(_kernel(*inp.args), _reference(*inp.args), dtype="float16")
    r = ds.isel(run=5)
    assert float(r.max_abs) == m.abs.max()
    assert float(r.max_ulp) == m.ulp.max()
    assert float(r.mean_signed) == pytest.approx(m.signed.mean())
    np.testing.assert_allclose(r.abs_quantile.values, np.quantile(m.abs, [0.5, 0.9, 0.99, 0.999]))
    assert float(r.K) == inp.covariates["K"]
    assert float(r.ref_max_abs) == pytest.approx(np.abs(_reference(*inp.args)).max())


def test_collect_is_reproducible(small_ds):
    again = tolstat.collect(_kernel, _reference, _make, op="matmul", dtype="fp16", runs=12,
                            hardware="test-cpu", seed=3, options=tolstat.CollectOptions(sample_size=64))
    xr.testing.assert_identical(again.drop_attrs(), small_ds.drop_attrs())


def test_groupby_and_select(small_ds):
    other = tolstat.collect(_kernel, _reference, _make, op="gemm", dtype="fp16", runs=5,
                            hardware="test-cpu", seed=4, options=tolstat.CollectOptions(sample_size=64))
    both = tolstat.concat([small_ds, other])
    groups = dict(both.groupby(["op", "dtype", "hardware"]))
    assert len(groups) == 2
    sel = tolstat.dataset.indexed(both).sel(op="gemm", dtype="float16")
    assert sel.sizes["run"] == 5
    assert len(json.loads(both.attrs["provenance"])) == 2


def test_from_pairs_and_default_hardware():
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(4):
        e = rng.standard_normal(100)
        pairs.append((e.astype(np.float32), e, {"variant": "v1"}))
    ds = tolstat.from_pairs(pairs, op="copy", dtype="float32")
    tolstat.dataset.validate(ds)
    assert ds.hardware.values[0].startswith(("cpu:", "cuda:"))
    assert "numpy" in str(ds.platform.values[0])
    assert (ds.max_ulp == 0).all()
    with pytest.raises(ValueError, match="no pairs"):
        tolstat.from_pairs([], op="x", dtype="float32")
    with pytest.raises(TypeError, match="pair 0"):
        tolstat.from_pairs([np.zeros(3)], op="x", dtype="float32")


def test_nonfinite_runs_are_kept(small_ds):
    ds = tolstat.from_pairs([(np.float16([np.nan, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]))],
                            op="x", dtype="fp16", hardware="h")
    assert int(ds.n_nonfinite[0]) == 1
    assert np.isinf(float(ds.max_abs[0])) and np.isinf(float(ds.mean_abs[0]))
    assert np.isinf(ds.sample_abs.values).sum() == 1


def test_bad_collections():
    with pytest.raises(ValueError, match="runs must be"):
        tolstat.collect(_kernel, _reference, _make, op="m", dtype="fp16", runs=0)
    with pytest.raises(ValueError, match="unknown target dtype"):
        tolstat.collect(_kernel, _reference, _make, op="m", dtype="int4", runs=1)
    with pytest.raises(ValueError, match="run 0: .*NaN"):
        tolstat.collect(_kernel, lambda a, b: np.full((16, 24), np.nan), _make, op="m",
                        dtype="fp16", runs=1)
    with pytest.raises(ValueError, match="reserved"):
        tolstat.from_pairs([(np.zeros(2, np.float16), np.zeros(2))], op="m", dtype="fp16",
                           options=tolstat.CollectOptions(labels={"max_abs": "x"}))


def test_concat_mismatched_labels_raises(small_ds):
    other = tolstat.from_pairs([(np.zeros(2, np.float16), np.zeros(2))], op="m", dtype="fp16",
                               options=tolstat.CollectOptions(labels={"variant": "a"}))
    with pytest.raises(ValueError, match="mismatched labels"):
        tolstat.concat([small_ds, other])


def test_validate_catches_problems(small_ds):
    with pytest.raises(TypeError, match="expected an xarray.Dataset, got DataArray"):
        tolstat.dataset.validate(small_ds.max_abs)
    with pytest.raises(ValueError, match="tolstat_schema"):
        tolstat.dataset.validate(small_ds.drop_attrs())
    with pytest.raises(ValueError, match="missing run statistic 'max_ulp'"):
        tolstat.dataset.validate(small_ds.drop_vars("max_ulp"))
    bad = small_ds.copy(deep=True)
    bad["max_abs"][0] = np.nan
    with pytest.raises(ValueError, match="'max_abs' contains NaN"):
        tolstat.dataset.validate(bad)
    bad = small_ds.copy(deep=True)
    bad["sample_abs"][0, 0] = -1.0
    with pytest.raises(ValueError, match="negative"):
        tolstat.dataset.validate(bad)
    bad = small_ds.assign_coords(dtype=("run", np.array(["float7"] * small_ds.sizes["run"])))
    with pytest.raises(ValueError, match="unknown dtype"):
        tolstat.dataset.validate(bad)


def _big_dataset(nrun=1000, k=4096):
    rng = np.random.default_rng(7)
    pairs = []
    for i in range(nrun):
        e = rng.standard_normal(k)
        a = e.astype(np.float16 if i % 2 else np.float32)
        pairs.append((a, e, {"kind": "even" if i % 2 == 0 else "odd"}))
    opts = tolstat.CollectOptions(sample_size=k)  # every element kept: a large sample round-trips
    ds = tolstat.from_pairs(pairs[: nrun // 2], op="id", dtype="float32", hardware="h", options=opts)
    # run-level mixture of dtypes through concat of two collections
    ds2 = tolstat.from_pairs(pairs[nrun // 2:], op="id", dtype="float16", hardware="h", options=opts)
    return tolstat.concat([ds, ds2])


@pytest.mark.parametrize("ext", [".nc", ".zarr"])
@pytest.mark.slow
def test_roundtrip_1000_runs(tmp_path, ext):
    ds = _big_dataset()
    assert ds.sizes["run"] == 1000 and ds.sizes["sample"] == 4096
    path = tmp_path / f"errors{ext}"
    tolstat.save(ds, path)
    back = tolstat.open_errors(path)
    xr.testing.assert_identical(back, ds)
    lazy = tolstat.open_errors(path, chunks={"run": 100})
    assert lazy.sample_abs.chunks is not None
    xr.testing.assert_identical(lazy.compute(), ds)


@pytest.mark.parametrize("ext", [".nc", ".zarr"])
def test_interrupted_save_keeps_old_file(tmp_path, monkeypatch, ext, small_ds):
    path = tmp_path / f"e{ext}"
    tolstat.save(small_ds, path)
    newer = tolstat.concat([small_ds, small_ds])
    method = "to_netcdf" if ext == ".nc" else "to_zarr"
    original = getattr(xr.Dataset, method)

    def crash(self, target, *args, **kwargs):
        original(self.isel(run=slice(0, 1)), target, *args, **kwargs)  # partial write
        raise KeyboardInterrupt("simulated crash mid-write")

    monkeypatch.setattr(xr.Dataset, method, crash)
    with pytest.raises(KeyboardInterrupt, match="simulated crash mid-write"):
        tolstat.save(newer, path)
    monkeypatch.undo()
    back = tolstat.open_errors(path)
    xr.testing.assert_identical(back, small_ds)
    # no temp files left; a zarr store is a link to its one current version directory
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if ".tmp-" in n] == []
    if ext == ".zarr":
        assert [n for n in names if ".v-" in n] == [os.readlink(path)]
    else:
        assert names == [path.name]


def test_truncated_netcdf_raises_clearly(tmp_path, small_ds):
    path = tmp_path / "e.nc"
    tolstat.save(small_ds, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="e.nc.*truncated or corrupt"):
        tolstat.open_errors(path)


def test_truncated_zarr_raises_clearly(tmp_path, small_ds):
    path = tmp_path / "e.zarr"
    tolstat.save(small_ds, path)
    chunk = next(p for p in (path / "sample_abs").iterdir() if not p.name.startswith("."))
    os.remove(chunk)
    with pytest.raises(ValueError, match="e.zarr.*chunks missing"):
        tolstat.open_errors(path)


def test_foreign_and_wrong_schema_files(tmp_path, small_ds):
    foreign = tmp_path / "foreign.nc"
    xr.Dataset({"t": ("x", np.arange(3.0))}).to_netcdf(foreign, engine="h5netcdf")
    with pytest.raises(ValueError, match="foreign.nc.*tolstat_schema"):
        tolstat.open_errors(foreign)
    text = tmp_path / "text.nc"
    text.write_text("not a netcdf file")
    with pytest.raises(ValueError, match="text.nc"):
        tolstat.open_errors(text)
    with pytest.raises(ValueError, match="extension"):
        tolstat.save(small_ds, tmp_path / "e.csv")
    with pytest.raises(FileNotFoundError, match="no error dataset at .*missing.nc"):
        tolstat.open_errors(tmp_path / "missing.nc")
    tolstat.save(small_ds, tmp_path / "x.zarr")
    with pytest.raises(ValueError, match="do not chunk along 'sample'"):
        tio.open_errors(tmp_path / "x.zarr", chunks={"sample": 10})


def test_pareto_front_makes_normalised_max_exact():
    """Any score increasing in |d| and non-increasing in |ref| has its run max in the sample."""
    rng = np.random.default_rng(11)
    for trial in range(5):
        e = rng.standard_normal(20000) * 10.0 ** rng.integers(-3, 3, 20000)
        a = e.astype(np.float16)
        ds = tolstat.from_pairs([(a, e)], op="x", dtype="fp16", hardware="h", seed=trial,
                                options=tolstat.CollectOptions(sample_size=1024))
        m = tolstat.error_metrics(a, e)
        s_abs, s_ref = ds.sample_abs.values[0], ds.sample_ref.values[0]
        for atol, rtol in [(1e-5, 1e-3), (1e-3, 0.0), (0.0, 1.0), (1e-8, 1e-2), (1.0, 1e-6)]:
            full = np.max(m.abs / (atol + rtol * m.ref_abs + 1e-300))
            samp = np.nanmax(s_abs / (atol + rtol * s_ref + 1e-300))
            assert samp == full
        assert 1 <= int(ds.n_frontier[0]) <= 512
        # the non-front part is still a uniform random sample: no duplicates
        assert len(np.unique(ds.sample_ref.values[0])) > 1000


def test_long_front_keeps_hull_allclose_maxima_exact():
    """Error proportional to |ref| puts most elements on the front; the hull keeps exactness."""
    rng = np.random.default_rng(12)
    e = rng.uniform(0.5, 100.0, 50000) * rng.choice([-1.0, 1.0], 50000)
    a = (e * (1 + 1e-3)).astype(np.float32)  # a scale bug-like error plus float32 rounding
    ds = tolstat.from_pairs([(a, e)], op="x", dtype="float32", hardware="h", options=tolstat.CollectOptions(sample_size=512))
    m = tolstat.error_metrics(a, e)
    assert int(ds.n_frontier[0]) > 256  # the front was truncated
    s_abs, s_ref = ds.sample_abs.values[0], ds.sample_ref.values[0]
    for atol, rtol in [(0.0, 1.0), (1e-3, 1e-3), (1.0, 1e-6), (1e-2, 1e-4), (10.0, 1.0)]:
        full = np.max(m.abs / (atol + rtol * m.ref_abs))
        samp = np.nanmax(s_abs / (atol + rtol * s_ref))
        assert samp == full, (atol, rtol)
    assert np.nanmax(s_abs) == m.abs.max()
