"""Dataset-layer boundaries refuse bad input with a clear error (docs/errors.md).

``save`` of a foreign ``xarray.Dataset``, an unbounded ``CollectOptions.sample_size`` and
a ``cluster=`` that is not a run label each raise an error naming the argument, the value
and what is allowed.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import tolstat

#: the documented bound of CollectOptions.sample_size (tolstat.dataset.options.MAX_SAMPLE_SIZE)
MAX_SAMPLE_SIZE = 2**24
pytest.importorskip("h5netcdf")


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _make(rng):
    k = int(rng.choice([16, 64]))
    return tolstat.Inputs(args=(rng.standard_normal(k),), labels={"dist": "normal"}, covariates={"K": k})


@pytest.fixture(scope="module")
def ds():
    return tolstat.collect(_kernel, _ref, _make, op="mul3", dtype="float16", runs=80, hardware="cpu",
                           seed=1, options=tolstat.CollectOptions(sample_size=32, progress=False))


# ------------------------------------------------------------------ save of a foreign dataset
@pytest.mark.parametrize("ext", ["nc", "zarr"])
@pytest.mark.parametrize("foreign, match", [
    (xr.Dataset({"a": ("x", [1.0])}), "missing attribute 'tolstat_schema'"),
    (xr.Dataset({"a": ("x", [1.0])}, attrs={"tolstat_schema": 1}), "missing dimension 'run'"),
    (xr.Dataset(), "missing attribute 'tolstat_schema'"),
])
def test_save_of_a_foreign_dataset_names_what_is_missing(tmp_path, ext, foreign, match):
    with pytest.raises(ValueError, match=f"invalid error dataset: {match}"):
        tolstat.save(foreign, tmp_path / f"e.{ext}")
    assert not any(tmp_path.iterdir())  # nothing written, no temporary left


# ------------------------------------------------------------------ sample_size is bounded
def test_sample_size_limit_is_accepted():
    from tolstat.dataset import options

    assert options.MAX_SAMPLE_SIZE == MAX_SAMPLE_SIZE
    assert tolstat.CollectOptions(sample_size=MAX_SAMPLE_SIZE).sample_size == MAX_SAMPLE_SIZE == 2**24


@pytest.mark.parametrize("size", [MAX_SAMPLE_SIZE + 1, 10**11, np.int64(2**40)])
def test_sample_size_above_the_limit_is_refused_naming_field_value_and_limit(size):
    with pytest.raises(ValueError, match=rf"CollectOptions.sample_size must be at most {MAX_SAMPLE_SIZE} "
                                         rf"\(2\*\*24\) elements per run, got {int(size)}"):
        tolstat.CollectOptions(sample_size=size)


def test_an_unbounded_sample_size_is_refused_before_anything_is_measured():
    calls = []

    def make(rng):
        calls.append(1)
        return (rng.standard_normal(8),)

    with pytest.raises(ValueError, match="sample_size"):
        tolstat.collect(_kernel, _ref, make, op="mul3", dtype="float16", runs=2, hardware="cpu",
                        options=tolstat.CollectOptions(sample_size=10**11))
    assert not calls


# ------------------------------------------------------------------ cluster= is a run label
@pytest.mark.parametrize("name, kind", [("max_abs", "a run statistic"), ("K", "a covariate"),
                                        ("ref_rms", "a covariate"), ("n_sample", "a variable"),
                                        ("nope", "not a variable")])
def test_cluster_must_be_a_run_label(ds, name, kind):
    with pytest.raises(ValueError, match=rf"cluster={name!r} is not a run label of the error dataset "
                                         rf"\({kind}\); labels are \[.*'dist'.*\]"):
        tolstat.select(ds, fp_budget=0.05, confidence=0.9, form=None, cluster=name)


@pytest.mark.parametrize("name", ["dist", "seed", "shape"])
def test_cluster_accepts_run_labels(ds, name):
    t = tolstat.select(ds, fp_budget=0.05, confidence=0.9, form=None, cluster=name, on_error="skip")
    assert t.statistics == ["max_abs"]


def test_cluster_by_a_free_label_joins_its_runs(ds):
    from tolstat.dataset.schema import run_units

    u = run_units(ds, "dist")  # every run has dist="normal": one unit
    assert u.n_units == 1 and u.by.startswith("cluster 'dist'")


def _units_by_union_find(groups, keys):
    """Runs joined when they share a group and any key's value: each unit's id is its first run."""
    n = len(groups)
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for k in keys:
        seen = {}
        for i in range(n):
            j = seen.setdefault((groups[i], k[i]), i)
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)
    return np.array([root(i) for i in range(n)])


@pytest.mark.parametrize("with_cluster", [False, True])
def test_run_units_equal_the_union_of_shared_keys_within_groups(with_cluster):
    import xarray as xr

    from tolstat.dataset.schema import FINGERPRINT, run_units

    rng = np.random.default_rng(8)
    # from 4,096 runs the fingerprints are first checked for any shared value (a bitmap
    # pass): all distinct, one repeated pair, many repeats
    for n, m in ((2, 1), (7, 3), (60, 50), (200, 20), (200, 200), (5000, 2**62), (5000, -1), (5000, 3000)):
        fp = rng.integers(0, 2**62 if m < 0 else m, n)
        if m < 0:
            fp[4321] = fp[17]
        case = rng.integers(0, max(2, n // 4), n)
        groups = rng.integers(0, 3, n)
        ds = xr.Dataset({FINGERPRINT: ("run", fp), "case": ("run", case.astype(str))}, attrs={"labels": "case"})
        u = run_units(ds, "case" if with_cluster else None, groups=groups)
        keys = [case, fp] if with_cluster else [fp]
        want = _units_by_union_find(groups, keys)
        np.testing.assert_array_equal(u.ids, want)
        assert u.n_units == np.unique(want).size and u.n_runs == n
