"""A streaming store survives a crash at any point of its finalizing (docs/errors.md, "Streaming stores").

When every run is done, ``collect(..., store=...)`` finalizes the store (string labels
from the log, the ``sample`` dimension trimmed, provenance, consolidated metadata). A
process killed in the middle of it must leave a store that either opens as complete or,
when ``collect`` is called again with the same arguments, resumes, completes and equals
an uninterrupted collection.

The crash is simulated by failing the ``n``-th file-system mutation (``os.replace``,
``os.rename``, ``os.link``, ``os.unlink``, ``os.rmdir``: the steps by which zarr and tolstat
change a store) once finalizing began, and every later one, like a killed process that
does nothing more: for every ``n`` (a test marked slow) and for a subset (by default).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.dataset import Store, stream

MUTATORS = ("replace", "rename", "link", "unlink", "rmdir")


def _kernel(a):
    return (a.astype(np.float32) + np.float32(1)).astype(np.float32)


def _reference(a):
    return a.astype(np.float32).astype(np.float64) + 1


def _make(rng):
    n = int(rng.integers(3, 40))
    # labels of different lengths, one long and non-ASCII: the rewritten label arrays vary in width
    dist = "n" if n < 20 else f"wide-ünïcode-✓-{'x' * n}"
    return tolstat.Inputs(args=(rng.standard_normal(n),), labels={"dist": dist}, covariates={"K": float(n)})


KW = dict(op="add", dtype="float32", runs=4, hardware="h", seed=0,  # one argument: not torch.add's
          options=tolstat.CollectOptions(sample_size=64, progress=False, op_model=False))


class Crash(OSError):
    """The simulated kill."""


class _Injector:
    """Fail the ``at``-th file-system mutation after arming, and every one after it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int) -> None:
        self.at, self.count, self.armed, self.crashed = at, 0, False, False
        for name in MUTATORS:
            orig = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(orig))

    def _wrap(self, orig):
        def mutate(*args, **kwargs):
            if self.armed:
                self.count += 1
                if self.crashed or self.count >= self.at:
                    self.crashed = True
                    raise Crash(f"simulated kill at file-system mutation {self.count}")
            return orig(*args, **kwargs)

        return mutate


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    a, b = a.copy(), b.copy()
    a.attrs.pop("provenance")
    b.attrs.pop("provenance")
    xr.testing.assert_identical(a, b)


def _collect(store: Path) -> xr.Dataset:
    return tolstat.collect(_kernel, _reference, _make, store=Store(store, chunk_runs=1), **KW)


@pytest.fixture(scope="module")
def expected():
    return tolstat.collect(_kernel, _reference, _make, **KW)


class _Unfinalized(Exception):
    """Stops a collection before it finalizes."""


@pytest.fixture(scope="module")
def unfinalized(tmp_path_factory):
    """A store with every run done and not finalized yet (copied for each crash)."""
    base = tmp_path_factory.mktemp("finalize") / "base.zarr"
    with pytest.MonkeyPatch.context() as m:
        def stop(*args, **kwargs):
            raise _Unfinalized

        m.setattr(stream, "_finalize", stop)
        with pytest.raises(_Unfinalized):
            _collect(base)
    prog = stream.store_progress(base)
    assert prog.done == list(range(KW["runs"])) and not prog.complete
    return base


@pytest.fixture(scope="module")
def finished(unfinalized):
    """The files of a store finalized without interruption, and the number of its mutations."""
    store = unfinalized.parent / "ref.zarr"
    shutil.copytree(unfinalized, store)
    with pytest.MonkeyPatch.context() as m:
        n = _crash_while_finalizing(m, store, at=10**9)
    assert n is not None and n > 20
    return _files(store), n


def _files(store: Path) -> list[str]:
    return sorted(p.relative_to(store).as_posix() for p in store.rglob("*"))


def _crash_while_finalizing(monkeypatch: pytest.MonkeyPatch, store: Path, at: int) -> int | None:
    """Finish ``store`` with the ``at``-th mutation of finalizing failing: None if it crashed,
    else the number of mutations finalizing made."""
    finalize = stream._finalize
    with monkeypatch.context() as m:
        inj = _Injector(m, at)

        def armed(*args, **kwargs):
            inj.armed = True
            try:
                return finalize(*args, **kwargs)
            finally:
                inj.armed = False

        m.setattr(stream, "_finalize", armed)
        try:
            _collect(store)
        except Crash:
            return None
        except Exception as exc:  # a crash inside zarr's threads may arrive chained
            if not isinstance(exc.__cause__ or exc.__context__, Crash):
                raise
            return None
        assert not inj.crashed, "a failed mutation was swallowed"
        return inj.count


def _crash_and_resume(monkeypatch, unfinalized: Path, finished, expected, at: int) -> None:
    """Crash finalizing at mutation ``at`` of a copy of ``unfinalized``; the store must open
    as complete or resume, complete and equal ``expected``."""
    store = unfinalized.parent / f"s{at}.zarr"
    shutil.copytree(unfinalized, store)
    assert _crash_while_finalizing(monkeypatch, store, at) is None
    prog = stream.store_progress(store)
    assert prog.done == list(range(KW["runs"]))  # every run stays done
    if prog.complete:  # the store is finished: it opens as it is
        _same(expected, tolstat.open_errors(store))
    # the same call again completes the store, whatever state the crash left
    _same(expected, _collect(store))
    _same(expected, tolstat.open_errors(store))
    assert stream.store_progress(store).complete
    assert _files(store) == finished[0]  # nothing left over from the crash
    shutil.rmtree(store)


@pytest.mark.slow
def test_a_crash_while_finalizing_resumes_and_completes(monkeypatch, unfinalized, finished, expected):
    """The first mutations of finalizing (staging and swapping the first label) and a
    stride through the rest, up to the last (the manifest marked complete); every point is
    the slow test's."""
    n = finished[1]
    points = sorted(set(range(1, 7)) | set(range(7, n, 17)) | {n})
    for at in points:
        _crash_and_resume(monkeypatch, unfinalized, finished, expected, at)


@pytest.mark.slow
def test_a_crash_at_any_point_of_finalizing_resumes_and_completes(monkeypatch, unfinalized, finished,
                                                                  expected):
    for at in range(1, finished[1] + 1):
        _crash_and_resume(monkeypatch, unfinalized, finished, expected, at)


def test_resume_after_a_crash_between_deleting_and_recreating_a_label(monkeypatch, tmp_path, expected):
    """The reported failure: killed after a label array was removed, before it was written again."""
    store = tmp_path / "k.zarr"
    rmtree = shutil.rmtree
    state = {"crashed": False}

    def rmtree_then_crash(path, *args, **kwargs):
        rmtree(path, *args, **kwargs)
        if not state["crashed"] and Path(path).name in stream.STRING_LABELS:
            state["crashed"] = True
            raise Crash(f"simulated kill after removing {path}")

    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", rmtree_then_crash)
        try:
            _collect(store)
        except Exception as exc:
            assert isinstance(exc, Crash) or isinstance(exc.__cause__ or exc.__context__, Crash), exc
    _same(expected, _collect(store))
    _same(expected, tolstat.open_errors(store))
