"""Streaming, resumable collection into a zarr store: equality with collect, kill and resume."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.dataset import Store, stream

KERNELS = textwrap.dedent(
    '''
    import os, signal
    import numpy as np
    import tolstat

    # counters and failure points live outside the functions, so that the code of
    # kernel/make (the store's identity) is the same in every process and test
    CALLS = []
    FAIL = {"kill_at": None, "raise_at": None}

    def kernel(a, b):
        if FAIL["kill_at"] is not None and len(CALLS) == FAIL["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float16)

    def reference(a, b):
        return a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)

    def make(rng):
        if FAIL["raise_at"] is not None and len(CALLS) == FAIL["raise_at"]:
            raise RuntimeError("boom")
        CALLS.append(1)
        k = int(rng.choice([8, 33, 128]))
        return tolstat.Inputs(
            args=(rng.standard_normal((4, k)), rng.standard_normal((k, 6))),
            labels={"dist": "normal" if k < 100 else "normal-wide"},  # labels of varying length
            covariates={"K": k},
        )

    KW = dict(op="matmul", dtype="fp16", runs=11, hardware="test-cpu", seed=5,
              options=tolstat.CollectOptions(sample_size=64, progress=False))
    '''
)

CHILD = textwrap.dedent(
    '''
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import kernels
    import tolstat
    from tolstat.dataset import Store

    store, mode, at = sys.argv[2], sys.argv[3], int(sys.argv[4])
    if mode == "kill_kernel":
        kernels.FAIL["kill_at"] = at

    if mode == "kill_write":  # die in the middle of writing a run's arrays
        import zarr
        orig = zarr.Array.__setitem__
        count = [0]
        def setitem(self, key, value):
            count[0] += 1
            if count[0] == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(self, key, value)
        zarr.Array.__setitem__ = setitem

    tolstat.collect(kernels.kernel, kernels.reference, kernels.make, store=Store(store, chunk_runs=2),
                    **kernels.KW)
    print("CALLS", len(kernels.CALLS))
    '''
)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    (d / "kernels.py").write_text(KERNELS)
    (d / "child.py").write_text(CHILD)
    sys.path.insert(0, str(d))
    import kernels as mod  # noqa: PLC0415

    yield d, mod
    sys.path.remove(str(d))
    sys.modules.pop("kernels", None)


@pytest.fixture(scope="module")
def expected(kernels):
    _, k = kernels
    return tolstat.collect(k.kernel, k.reference, k.make, **k.KW)


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    a = a.copy()
    b = b.copy()
    a.attrs.pop("provenance")
    b.attrs.pop("provenance")
    xr.testing.assert_identical(a, b)


def _child(kdir: Path, store: Path, mode: str, at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(tolstat.__file__).parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, str(kdir / "child.py"), str(kdir), str(store), mode, str(at)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_store_equals_collect(kernels, expected, tmp_path):
    _, k = kernels
    ds = tolstat.collect(k.kernel, k.reference, k.make, store=Store(tmp_path / "r.zarr", chunk_runs=3), **k.KW)
    tolstat.dataset.validate(ds)
    _same(expected, ds)
    # the finished store is an ordinary error dataset
    _same(expected, tolstat.open_errors(tmp_path / "r.zarr"))
    lazy = tolstat.open_errors(tmp_path / "r.zarr", chunks={"run": 4})
    _same(expected, lazy.load())
    prov = json.loads(ds.attrs["provenance"])
    assert prov[0]["created_by"] == "tolstat.collect" and prov[0]["streamed"] is True
    # a second call finds it complete: nothing is measured again
    before = len(k.CALLS)
    again = tolstat.collect(k.kernel, k.reference, k.make, store=Store(tmp_path / "r.zarr", chunk_runs=3),
                            **k.KW)
    assert len(k.CALLS) == before
    _same(expected, again)


def test_small_runs_and_sample_padding(tmp_path):
    kw = dict(op="add", dtype="float32", runs=5, hardware="h", seed=0,  # x + 1: not torch.add's arguments
              options=tolstat.CollectOptions(sample_size=4096, op_model=False))

    def kern(a):
        return (a.astype(np.float32) + np.float32(1)).astype(np.float32)

    def ref(a):
        return a.astype(np.float32).astype(np.float64) + 1

    def mk(rng):
        return (rng.standard_normal(int(rng.integers(3, 40))),)

    a = tolstat.collect(kern, ref, mk, **kw)
    b = tolstat.collect(kern, ref, mk, store=tmp_path / "s.zarr", **kw)
    assert b.sizes["sample"] == a.sizes["sample"] < 4096
    _same(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("mode,at", [("kill_kernel", 1), ("kill_kernel", 6), ("kill_write", 40),
                                     ("kill_write", 3)])
def test_kill_and_resume(kernels, expected, tmp_path, mode, at):
    kdir, k = kernels
    store = tmp_path / "k.zarr"
    res = _child(kdir, store, mode, at)
    assert res.returncode == -9, res.stderr  # SIGKILL
    if store.exists():
        prog = stream.store_progress(store)
        assert not prog.complete
        done_before = len(prog.done)
        assert done_before < k.KW["runs"]
        with pytest.raises(ValueError, match="unfinished"):
            stream.open_store(store)
        if done_before:
            part = stream.open_store(store, partial=True)
            np.testing.assert_array_equal(part.run_index.values, prog.done)
            _same(expected.isel(run=prog.done, sample=slice(0, part.sizes["sample"])), part)
    else:  # killed before the store was created (run 0 in flight)
        done_before = 0
    res = _child(kdir, store, "none", 0)
    assert res.returncode == 0, res.stderr
    # only the missing runs were measured again (nothing duplicated)
    assert f"CALLS {k.KW['runs'] - done_before}" in res.stdout
    ds = tolstat.open_errors(store)
    np.testing.assert_array_equal(ds.run_index.values, np.arange(k.KW["runs"]))
    _same(expected, ds)


@pytest.mark.slow
def test_refuses_different_arguments(kernels, tmp_path):
    _, k = kernels
    store = tmp_path / "d.zarr"
    tolstat.collect(k.kernel, k.reference, k.make, store=store, **dict(k.KW, runs=2))
    with pytest.raises(ValueError, match=r"different arguments.*seed: store has 5, call has 6"):
        tolstat.collect(k.kernel, k.reference, k.make, store=store, **dict(k.KW, runs=2, seed=6))
    with pytest.raises(ValueError, match="runs: store has 2"):
        tolstat.collect(k.kernel, k.reference, k.make, store=store, **k.KW)
    with pytest.raises(ValueError, match="kernel"):
        tolstat.collect(k.reference, k.reference, k.make, store=store, **dict(k.KW, runs=2))
    ds = tolstat.collect(k.kernel, k.reference, k.make, store=Store(store, overwrite=True),
                         **dict(k.KW, runs=3, seed=6))
    assert ds.sizes["run"] == 3 and (ds.seed == 6).all()


def test_foreign_store_and_bad_path(kernels, tmp_path):
    _, k = kernels
    ds = tolstat.collect(k.kernel, k.reference, k.make, **dict(k.KW, runs=2))
    tolstat.save(ds, tmp_path / "plain.zarr")
    with pytest.raises(ValueError, match="not a tolstat streaming store"):
        tolstat.collect(k.kernel, k.reference, k.make, store=tmp_path / "plain.zarr", **k.KW)
    with pytest.raises(ValueError, match="ending in '.zarr'"):
        tolstat.collect(k.kernel, k.reference, k.make, store=tmp_path / "x.nc", **k.KW)


def test_torn_log_line_is_ignored(kernels, expected, tmp_path):
    _, k = kernels
    store = tmp_path / "t.zarr"
    kw = dict(k.KW)

    k.CALLS.clear()
    k.FAIL["raise_at"] = 4
    try:
        with pytest.raises(RuntimeError, match="boom"):
            tolstat.collect(k.kernel, k.reference, k.make, store=store, **kw)
    finally:
        k.FAIL["raise_at"] = None
    assert stream.store_progress(store).done == [0, 1, 2, 3]
    with open(store / stream.SIDE / stream.LOG, "ab") as fh:  # a crash mid-append
        fh.write(b'{"i": 4, "lab')
    assert stream.store_progress(store).done == [0, 1, 2, 3]
    ds = tolstat.collect(k.kernel, k.reference, k.make, store=store, **kw)
    _same(expected, ds)


@pytest.mark.slow
def test_topk_on_streamed_store(kernels, expected, tmp_path):
    from tolstat.models.estimators import tail

    _, k = kernels
    store = tmp_path / "z.zarr"
    tolstat.collect(k.kernel, k.reference, k.make, store=Store(store, chunk_runs=2), **k.KW)
    lazy = tolstat.open_errors(store, chunks={"run": 3})
    xr.testing.assert_identical(tail.group_topk(expected, "sample_ulp", 50),
                                tail.group_topk(lazy, "sample_ulp", 50))


# ----------------------------------------------------------------- operator statistics
def _mm_kernel(a, b):
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


def _mm_reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def _mm_magnitude(a, b):
    return np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))


def _mm_make(rng):
    k = int(rng.choice([16, 64]))
    a = rng.standard_normal((4, k)).astype(np.float16)
    b = rng.standard_normal((k, 8)).astype(np.float16)
    return tolstat.Inputs(args=(a, b), labels={"dist": "normal"}, covariates={"K": float(k)})


MM_KW = dict(op="matmul", dtype="float16", runs=7, hardware="h", seed=3)
#: calls of _mm_make_failing and the call that raises (module state: the code hash of the
#: function, the store's identity, must not change between the calls)
_MM_CALLS: list[int] = []
_MM_FAIL: dict[str, int | None] = {"at": None}


def _mm_make_failing(rng):
    _MM_CALLS.append(1)
    if len(_MM_CALLS) == _MM_FAIL["at"]:
        raise RuntimeError("boom")
    return _mm_make(rng)


@pytest.mark.parametrize("options", [
    tolstat.CollectOptions(magnitude=_mm_magnitude, sample_size=16, progress=False),
    tolstat.CollectOptions(magnitude="ref", rowwise=True, sample_size=16, progress=False),
], ids=["callable", "ref-rowwise"])
@pytest.mark.slow
def test_store_with_operator_statistics_equals_collect(tmp_path, options):
    want = tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, options=options)
    op_vars = sorted(v for v in want.data_vars if want[v].attrs.get("role") == "op_statistic")
    assert "op_max" in op_vars and "op_rms_mid" in op_vars
    if options.rowwise:
        assert "op_row_rms_max" in op_vars
    got = tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, options=options,
                          store=Store(tmp_path / "o.zarr", chunk_runs=2))
    assert sorted(got.data_vars) == sorted(want.data_vars)
    _same(want, got)
    _same(want, stream.open_store(tmp_path / "o.zarr"))
    assert stream.store_progress(tmp_path / "o.zarr").manifest["magnitude"] == (
        "ref" if options.magnitude == "ref" else "_mm_magnitude")


@pytest.mark.slow
def test_store_with_operator_statistics_resumes(tmp_path):
    options = tolstat.CollectOptions(magnitude=_mm_magnitude, sample_size=16, progress=False)
    want = tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, options=options)
    store = tmp_path / "r.zarr"
    _MM_CALLS.clear()
    _MM_FAIL["at"] = 5  # the 5th run fails: the first four stay in the store
    try:
        with pytest.raises(RuntimeError, match="boom"):
            tolstat.collect(_mm_kernel, _mm_reference, _mm_make_failing, **MM_KW, options=options, store=store)
    finally:
        _MM_FAIL["at"] = None
    assert stream.store_progress(store).done == [0, 1, 2, 3]
    part = stream.open_store(store, partial=True)
    assert "op_max" in part
    _same(want.isel(run=[0, 1, 2, 3], sample=slice(0, part.sizes["sample"])), part)
    _MM_CALLS.clear()
    _same(want, tolstat.collect(_mm_kernel, _mm_reference, _mm_make_failing, **MM_KW, options=options,
                                store=store))
    assert len(_MM_CALLS) == 3  # only the missing runs


@pytest.mark.slow
def test_store_refuses_a_different_magnitude(tmp_path):
    store = tmp_path / "m.zarr"
    opts = tolstat.CollectOptions(magnitude=_mm_magnitude, sample_size=16, progress=False)
    tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, options=opts, store=store)

    def changed(a, b):
        return np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) * 2

    changed.__qualname__ = "_mm_magnitude"  # same name, another body

    for other, match in [
        (dict(magnitude="ref"), r"different arguments.*magnitude: store has '_mm_magnitude', call has 'ref'"),
        (dict(magnitude=None), r"magnitude: store has '_mm_magnitude', call has None"),
        (dict(rowwise=True), r"rowwise: store has False, call has True"),
        (dict(magnitude=changed), r"magnitude: the code of '_mm_magnitude' differs"),
    ]:
        with pytest.raises(ValueError, match=match):
            tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, store=store,
                            options=dataclasses.replace(opts, **other))
    # a plain store (no operator statistics) refuses a magnitude too
    plain = tmp_path / "p.zarr"
    tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, store=plain,
                    options=tolstat.CollectOptions(sample_size=16, progress=False))
    with pytest.raises(ValueError, match="magnitude: store has None, call has 'ref'"):
        tolstat.collect(_mm_kernel, _mm_reference, _mm_make, **MM_KW, store=plain,
                        options=tolstat.CollectOptions(sample_size=16, magnitude="ref", progress=False))


def test_store_made_before_the_operator_statistics_resumes(kernels, expected, tmp_path):
    """A manifest without the magnitude / rowwise keys means no operator statistics."""
    _, k = kernels
    store = tmp_path / "old.zarr"
    k.CALLS.clear()
    k.FAIL["raise_at"] = 3
    try:
        with pytest.raises(RuntimeError, match="boom"):
            tolstat.collect(k.kernel, k.reference, k.make, store=store, **k.KW)
    finally:
        k.FAIL["raise_at"] = None
    old = {key: v for key, v in stream.store_progress(store).manifest.items()
           if key not in ("magnitude", "rowwise", "magnitude_code")}
    stream._write_manifest(store, old)
    _same(expected, tolstat.collect(k.kernel, k.reference, k.make, store=store, **k.KW))
