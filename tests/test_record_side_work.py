"""A run's record with part of its work on a second core.

For runs of ``tolstat.dataset.runs.SIDE_WORK_SIZES`` elements, a collection computes the
ULP distances, the operator statistics and the reference's fingerprint on a second
thread while the main one computes the other metrics and the record. The same functions
of the same arrays: the dataset is identical to the one recorded in sequence, errors are
raised as in sequence (with the run's index), and no work of a failed run is left running.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

import tolstat
import tolstat.dataset.runs as runs

COLS = 128


def _softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _kernel(x: np.ndarray, dim: int) -> np.ndarray:
    return _softmax(x.astype(np.float32), dim).astype(np.float16)


def _reference(x: np.ndarray, dim: int) -> np.ndarray:
    return _softmax(x.astype(np.float64), dim)


def _inputs(rows: int):
    def make(rng: np.random.Generator) -> tuple[np.ndarray, int]:
        return rng.standard_normal((rows, COLS)).astype(np.float16), -1
    return make


def _collect(monkeypatch: pytest.MonkeyPatch, side: bool, rows: int, **kw) -> xr.Dataset:
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40) if side else (1 << 40, 1 << 41))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tolstat.collect(_kernel, _reference, _inputs(rows), op="softmax", dtype="float16", runs=6,
                               hardware="cpu", options=tolstat.CollectOptions(progress=False, **kw))


def _side_used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs whose side work was submitted."""
    calls: list[int] = []
    real = runs._side_work

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(runs, "_side_work", counted)
    return calls


@pytest.mark.skipif(runs._side_worker(np.zeros(1 << 15)) is None, reason="one core: no side work")
@pytest.mark.parametrize("kw", [{}, {"op_model": False}, {"sample_size": 64}])
def test_a_record_with_side_work_is_the_record_made_in_sequence(monkeypatch, kw):
    calls = _side_used(monkeypatch)
    seq = _collect(monkeypatch, False, 32, **kw)
    assert not calls
    par = _collect(monkeypatch, True, 32, **kw)
    assert len(calls) == 6  # every run took the side path
    xr.testing.assert_identical(par.drop_attrs(), seq.drop_attrs())
    if kw.get("op_model", True):
        assert any(v.attrs.get("role") == "op_statistic" for v in par.data_vars.values())


def test_side_work_is_used_only_for_mid_sized_runs_of_a_process_with_two_cores():
    lo, hi = runs.SIDE_WORK_SIZES
    assert runs._side_worker(np.zeros(lo - 1)) is None and runs._side_worker(np.zeros(hi + 1)) is None
    assert runs._side_worker([0.0] * lo) is None  # not an array: no size to judge by
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert (runs._side_worker(np.zeros(lo)) is not None) == (cores >= 2)
    torch = sys.modules.get("torch")
    if torch is not None:  # a tensor's size() is its shape: numel counts it
        assert (runs._side_worker(torch.zeros(lo)) is not None) == (cores >= 2)


@pytest.mark.skipif(runs._side_worker(np.zeros(1 << 15)) is None, reason="one core: no side work")
def test_a_broken_reference_is_reported_as_in_sequence_and_nothing_is_left_running(monkeypatch):
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    a = np.ones((4, COLS), dtype=np.float16)
    e = np.ones((4, COLS))
    e[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"run 0: reference \(expected\) contains 1 NaN"):
        tolstat.from_pairs([(a, e)], op="softmax", dtype="float16", hardware="cpu",
                           options=tolstat.CollectOptions(progress=False, magnitude="ref"))
    # the side thread is idle again: a new task runs at once
    assert runs._side_worker(e).submit(lambda: 7).result(timeout=30) == 7


@pytest.mark.skipif(runs._side_worker(np.zeros(1 << 15)) is None, reason="one core: no side work")
@pytest.mark.parametrize("side", [False, True])
def test_an_error_of_the_operator_statistics_names_its_run_on_both_paths(monkeypatch, side):
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40) if side else (1 << 40, 1 << 41))

    def broken(*a, **kw):
        raise ValueError("the statistics could not be computed")
    monkeypatch.setattr(runs, "_op_stats", broken)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, COLS)).astype(np.float16)
    pairs = [(_kernel(x, -1), _reference(x, -1))] * 2
    with pytest.raises(ValueError, match="run 0: the statistics could not be computed"):
        tolstat.from_pairs(pairs, op="softmax", dtype="float16", hardware="cpu",
                           options=tolstat.CollectOptions(progress=False, magnitude="ref"))


def _child(conn) -> None:  # pragma: no cover - runs in a forked child
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, COLS)).astype(np.float16)
    ds = tolstat.from_pairs([(_kernel(x, -1), _reference(x, -1))], op="softmax", dtype="float16",
                            hardware="cpu", options=tolstat.CollectOptions(progress=False, magnitude="ref"))
    conn.send(int(ds.sizes["run"]))


@pytest.mark.skipif(runs._side_worker(np.zeros(1 << 15)) is None or sys.platform != "linux",
                    reason="needs two cores and fork")
def test_a_forked_child_gets_its_own_side_thread(monkeypatch):
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    parent = runs._side_worker(np.zeros(4))
    assert parent is not None and parent.submit(lambda: 1).result(timeout=30) == 1  # its thread is running
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a process with threads
        p = ctx.Process(target=_child, args=(send,))
        p.start()
    try:
        assert recv.poll(120), "the child's record did not finish (a side thread that is not there)"
        assert recv.recv() == 1
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0


@pytest.mark.skipif(runs._side_worker(np.zeros(1 << 15)) is None, reason="one core: no side work")
def test_side_work_runs_under_the_callers_floating_point_error_handling(monkeypatch):
    """numpy's errstate is not inherited by a thread: the side work gets the caller's."""
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    seen: list[dict] = []
    real_ulp, real_side = runs.ulp_distance, runs._side_work

    def ulp(*a, **kw):
        seen.append(np.geterr())
        return real_ulp(*a, **kw)

    def side(*a, **kw):
        seen.append(np.geterr())
        return real_side(*a, **kw)
    monkeypatch.setattr(runs, "ulp_distance", ulp)
    monkeypatch.setattr(runs, "_side_work", side)
    x = np.random.default_rng(2).standard_normal((4, COLS)).astype(np.float16)
    for setting in ("ignore", "raise"):
        with np.errstate(all=setting):
            tolstat.from_pairs([(_kernel(x, -1), _reference(x, -1))], op="softmax", dtype="float16",
                               hardware="cpu", options=tolstat.CollectOptions(progress=False, magnitude="ref"))
        assert seen[-2:] == [dict.fromkeys(("divide", "over", "under", "invalid"), setting)] * 2
