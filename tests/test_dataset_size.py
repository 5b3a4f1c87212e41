"""Small error-dataset files: what a saved dataset keeps, its size, and the same thresholds.

Runs of 4,096 elements (64x64 matmul outputs, fp16 and bf16, K in {16, 64, 256}) built
through :func:`tolstat.from_pairs`. Two claims are tested (``docs/schema.md``, "Storage"):

* :func:`tolstat.save` is lossless: its compressed file (float32 only for a sample variable
  exact in float32) reopens bit for bit equal to the dataset and to a file written as
  before (uncompressed float64, which still opens), so :func:`tolstat.select` gives the
  *identical* table for the default and for every named form -- compared exactly, since
  the same numbers go in.
* The default element sample (``CollectOptions().sample_size``, 320 of the 4,096 elements)
  makes 2,400 runs fit in 10 MB and gives the *identical* table of every form to a dataset
  that keeps every element (``sample_size=4096``): the run-level forms use per-run
  statistics (and, for ``baseline``, the run's largest error, in every sample); the fitted
  scale forms read only the fit sample (the first ``n_fit`` slots: a uniform draw of 256
  elements, the same for both) and score runs on the front or hull, kept whole in both.

The 2,400-run version is ``slow`` (budget 0.01, every form); the fast ones use 120 runs
(budget 0.1, the run-level forms and ``allclose``) and the same assertions, the size one
per run.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.dataset.io import storage_info

#: forms whose thresholds use only per-run statistics (operator statistics, max_abs) or,
#: for ``baseline``, the run's largest error (always in the sample) over a run covariate
RUN_LEVEL_FORMS = ("auto", "operator", None, "baseline")
#: every named form of select on a dataset with operator statistics
ALL_FORMS = RUN_LEVEL_FORMS + ("allclose", "size_aware", "normalised")
#: the fast test's forms: the run-level ones and one fitted scale form (all of them: slow)
FAST_FORMS = RUN_LEVEL_FORMS + ("allclose",)
#: the issue's target: 2,400 runs in at most 10 MB
TARGET_BYTES_PER_RUN = 10e6 / 2400


def _pairs(dt: Any, n: int, seed: int) -> list[tuple[Any, ...]]:
    """``n`` (actual, expected, magnitude, labels, covariates) of a fp32-accumulating matmul;
    the covariate ``baseline_max_abs`` is the error of rounding the reference once (the
    same-precision baseline of ``form="baseline"``)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.choice([16, 64, 256]))
        a = rng.standard_normal((64, k)).astype(dt).astype(np.float64)
        b = rng.standard_normal((k, 64)).astype(dt).astype(np.float64)
        actual = (a.astype(np.float32) @ b.astype(np.float32)).astype(dt)
        ref = a @ b
        base = float(np.max(np.abs(ref.astype(dt).astype(np.float64) - ref)))
        out.append((actual, ref, np.abs(a) @ np.abs(b), {}, {"K": k, "baseline_max_abs": base}))
    return out


@functools.lru_cache(maxsize=4)
def _dataset(runs: int, sample_size: int = 4096) -> xr.Dataset:
    """``runs`` runs of 4,096 elements, half float16 and half bfloat16 (one group each);
    built once per size (the tests only read it)."""
    parts = []
    for j, (name, dt) in enumerate((("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16))):
        parts.append(tolstat.from_pairs(_pairs(dt, runs // 2, 11 + j), op="matmul", dtype=name, hardware="cpu:test",
                                        options=tolstat.CollectOptions(sample_size=sample_size, progress=False)))
    return tolstat.concat(parts)


def _table(ds: xr.Dataset, form: Any, budget: float) -> dict[str, Any]:
    """The table of ``select`` as a dict, without its creation time (the only field that may differ)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = tolstat.select(ds, fp_budget=budget, form=form).to_dict()
    d.get("provenance", {}).pop("created", None)
    return d


def _thresholds(d: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(g["op"], g["dtype"]): next(iter(g["statistics"].values()))["threshold"] for g in d["groups"]}


def _same_values(a: xr.Dataset, b: xr.Dataset) -> None:
    """Every variable of ``a`` is in ``b`` with the same dtype and bit for bit the same values."""
    assert set(a.variables) == set(b.variables)
    for name in a.variables:
        x, y = np.asarray(a[name].values), np.asarray(b[name].values)
        assert x.dtype.kind == y.dtype.kind and x.shape == y.shape, name
        if x.dtype.kind == "f":
            assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
            assert np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y)), name
        else:
            assert np.array_equal(x, y), name


def _old_style(ds: xr.Dataset, path: Path) -> Path:
    """``ds`` written as :func:`tolstat.save` wrote it before: float64 samples; netCDF
    uncompressed, zarr with its default compressor."""
    from tolstat.dataset.schema import normalize_labels

    out = normalize_labels(ds)
    if path.suffix == ".nc":
        out.to_netcdf(path, engine="h5netcdf")
    else:
        out.to_zarr(path, mode="w", consolidated=True, write_empty_chunks=True, zarr_format=2)
    return path


def _check_lossless(ds: xr.Dataset, tmp_path: Path, budget: float, forms: tuple[Any, ...]) -> dict[str, int]:
    sizes = {}
    for ext in (".nc", ".zarr"):
        new = tolstat.save(ds, tmp_path / f"new{ext}")
        old = _old_style(ds, tmp_path / f"old{ext}")
        sizes[ext] = (storage_info(new)["bytes"], storage_info(old)["bytes"])
        if ext == ".nc":
            # measured 0.35 of the uncompressed size on these runs; 0.5 leaves room for
            # other data while still failing if compression or the float32 ULPs were lost
            assert sizes[ext][0] <= 0.5 * sizes[ext][1], sizes
        else:  # zarr was compressed before (Blosc); the float32 ULPs save a little more
            assert sizes[ext][0] <= sizes[ext][1], sizes
        info = storage_info(new)
        assert info["stored"]["sample_ulp"]["dtype"] == "float32"
        # |d| is stored once: sample_abs keeps only what abs(sample_signed) is not (inf errors)
        assert info["stored"]["sample_abs"]["derived"].startswith("abs(sample_signed)")
        assert info["stored"]["sample_abs"]["compression"] != "none"
        assert info["stored"]["sample_signed"]["dtype"] == "float64"  # d is not exact in float32
        assert storage_info(old)["stored"]["sample_ulp"]["dtype"] == "float64"
        reopened_new, reopened_old = tolstat.open_errors(new), tolstat.open_errors(old)
        _same_values(ds, reopened_new)
        _same_values(reopened_old, reopened_new)
        if ext == ".nc":  # compress=False: uncompressed and as exact
            fast = tolstat.save(ds, tmp_path / "fast.nc", compress=False)
            assert storage_info(fast)["stored"]["sample_abs"]["compression"] == "none"
            assert storage_info(fast)["bytes"] > 2 * sizes[ext][0]
            _same_values(ds, tolstat.open_errors(fast))
    # same numbers in, same table out: exact equality of the whole table, every form
    reopened_new, reopened_old = tolstat.open_errors(tmp_path / "new.nc"), tolstat.open_errors(tmp_path / "old.nc")
    for form in forms:
        assert _table(reopened_new, form, budget) == _table(reopened_old, form, budget), form
    plain = [v for v in reopened_new.data_vars if reopened_new[v].attrs.get("role") == "op_statistic"]
    # form="auto" without operator statistics picks and fits a scale form per group
    assert _table(reopened_new.drop_vars(plain), "auto", budget) == _table(reopened_old.drop_vars(plain), "auto", budget)
    return sizes


def _groups(d: dict[str, Any]) -> list[Any]:
    """The calibrated groups of a table dict (thresholds, scale models, certificates)."""
    return d["groups"]


def _check_bounded(full: xr.Dataset, small: xr.Dataset, tmp_path: Path, budget: float) -> float:
    path = tolstat.save(small, tmp_path / "small.nc")
    info = storage_info(path)
    size = tolstat.CollectOptions().sample_size
    assert info["sample_per_run"][2] <= size and info["sample"] <= size < int(full["n_elements"].min())
    # the cost of one more run (a file's fixed part -- header, labels' tables -- spread over
    # 2,400 runs is small, over 120 it is not): the file of every other run against this one
    half = tolstat.save(small.isel(run=slice(0, None, 2)), tmp_path / "half.nc")
    per_run = (info["bytes"] - storage_info(half)["bytes"]) / (small.sizes["run"] - small.sizes["run"] // 2)
    assert per_run <= TARGET_BYTES_PER_RUN, (per_run, info)
    assert int(full["n_sample"].min()) == int(full["n_elements"].max())  # `full` keeps every element
    reopened = tolstat.open_errors(path)
    for form in ALL_FORMS:
        # exact: run-level forms read per-run values; the scale forms the same fit sample,
        # and run scores on the front or hull, which both samples hold whole
        assert _groups(_table(reopened, form, budget)) == _groups(_table(full, form, budget)), form
    plain = [v for v in full.data_vars if full[v].attrs.get("role") == "op_statistic"]
    assert (_groups(_table(reopened.drop_vars(plain), "auto", budget))
            == _groups(_table(full.drop_vars(plain), "auto", budget)))
    return info["bytes"]


@pytest.mark.slow
def test_save_is_lossless_and_smaller_same_tables(tmp_path: Path) -> None:
    _check_lossless(_dataset(120), tmp_path, 0.1, FAST_FORMS)


def test_default_sample_fits_target_and_gives_every_form_the_full_sample_table(tmp_path: Path) -> None:
    _check_bounded(_dataset(120), _dataset(120, sample_size=tolstat.CollectOptions().sample_size), tmp_path, 0.1)


def test_summary_shows_size_and_what_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tolstat.cli.main import main

    path = tolstat.save(_dataset(4, sample_size=64), tmp_path / "e.nc")
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    size = storage_info(path)["bytes"]
    assert f"{size / 1e6:.2f} MB on disk" in out
    assert "an element sample of 64 elements" in out
    assert "sample_ulp: float32, compression zlib-1+shuffle" in out
    assert "sample_ref: float64, compression zlib-1+shuffle" in out


@pytest.mark.slow
def test_2400_runs(tmp_path: Path) -> None:
    full = _dataset(2400)
    sizes = _check_lossless(full, tmp_path, 0.01, ALL_FORMS)
    small = _dataset(2400, sample_size=tolstat.CollectOptions().sample_size)
    nbytes = _check_bounded(full, small, tmp_path, 0.01)
    assert nbytes <= 10e6, (nbytes, sizes)


def _exact_definition(v: np.ndarray) -> bool:
    """Every value round-trips through float32 (the whole-array definition)."""
    with np.errstate(over="ignore", invalid="ignore"):
        back = v.astype(np.float32).astype(np.float64)
    same = (back == v) | (np.isnan(back) & np.isnan(v))
    return bool(same.all() and np.array_equal(np.signbit(back), np.signbit(v)))


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_float32_exactness_in_blocks_equals_the_whole_array_definition(block, monkeypatch):
    from tolstat.dataset import io

    monkeypatch.setattr(io, "_EXACT_BLOCK", block)
    rng = np.random.default_rng(block)
    ints = rng.integers(-3000, 3000, (40, 9)).astype(np.float64)
    ints[3, 4], ints[7, 1], ints[9, 2] = np.nan, -0.0, np.inf
    cases = [ints, np.zeros((0, 5)), rng.standard_normal((40, 9))]
    for where in [(0, 0), (39, 8), (20, 3)]:  # one inexact value, first, last or middle block
        bad = ints.copy()
        bad[where] = 0.1
        cases.append(bad)
    big = ints.copy()
    big[5, 5] = 2.0 ** 200  # overflows float32: not exact
    cases.append(big)
    for v in cases:
        assert io._exact_in_float32(xr.Variable(("run", "sample"), v)) == _exact_definition(v)
    assert io._exact_in_float32(xr.Variable(("run", "sample"), ints.astype(np.float32))) is False
