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
from tolstat._base import threads

TWO_CORES = threads.cores() >= 2

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


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
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


def test_side_work_is_used_only_for_mid_sized_runs():
    lo, hi = runs.SIDE_WORK_SIZES
    assert not runs._side_work_size(np.zeros(lo - 1)) and not runs._side_work_size(np.zeros(hi + 1))
    assert runs._side_work_size(np.zeros(lo)) and runs._side_work_size(np.zeros(hi))
    assert not runs._side_work_size([0.0] * lo)  # not an array: no size to judge by
    torch = sys.modules.get("torch")
    if torch is not None:  # a tensor's size() is its shape: numel counts it
        assert runs._side_work_size(torch.zeros(lo)) and not runs._side_work_size(torch.zeros(lo - 1))


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
def test_a_caller_that_finds_the_side_thread_busy_computes_its_share_itself():
    import threading

    gate = threading.Event()
    held = threads.submit_side((gate.wait, (30,), {}), (abs, (-2,), {}))
    assert held is not None
    try:
        assert threads.submit_side((abs, (-3,), {})) is None  # busy with the other caller's calls
    finally:
        gate.set()
    assert [f.result(timeout=30) for f in held] == [True, 2]
    again = threads.submit_side((abs, (-3,), {}))
    assert again is not None and again[0].result(timeout=30) == 3


def test_one_core_means_no_side_thread(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 1)
    monkeypatch.setattr(threads, "_STATE", {"pid": None, "executor": None, "busy": 0})  # a new process
    assert threads.submit_side((abs, (-1,), {})) is None
    assert threads._STATE["pid"] is not None and threads._STATE["executor"] is None


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
def test_a_broken_reference_is_reported_as_in_sequence_and_nothing_is_left_running(monkeypatch):
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    a = np.ones((4, COLS), dtype=np.float16)
    e = np.ones((4, COLS))
    e[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"run 0: reference \(expected\) contains 1 NaN"):
        tolstat.from_pairs([(a, e)], op="softmax", dtype="float16", hardware="cpu",
                           options=tolstat.CollectOptions(progress=False, magnitude="ref"))
    # the side thread is free again: the next caller's calls are taken
    got = threads.submit_side((abs, (-7,), {}))
    assert got is not None and got[0].result(timeout=30) == 7


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
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


@pytest.mark.skipif(not TWO_CORES or sys.platform != "linux", reason="needs two cores and fork")
def test_a_forked_child_gets_its_own_side_thread(monkeypatch):
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    parent = threads.submit_side((abs, (-1,), {}))
    assert parent is not None and parent[0].result(timeout=30) == 1  # the parent's side thread is running
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


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
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


def _ln(x: np.ndarray, shape: tuple, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + x.dtype.type(eps)) * w + b


def _ln_run(rng: np.random.Generator, rows: int, cols: int = 256) -> dict:
    x = rng.standard_normal((rows, cols)).astype(np.float16)
    w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float16)
    b = (0.1 * rng.standard_normal(cols)).astype(np.float16)
    args = (x, (cols,), w, b)
    out = _ln(*(v.astype(np.float32) if isinstance(v, np.ndarray) else v for v in args)).astype(np.float16)
    ref = _ln(*(v.astype(np.float64) if isinstance(v, np.ndarray) else v for v in args))
    return {"actual": out, "expected": ref, "inputs": args, "params": {"eps": 1e-5}}


@pytest.fixture(scope="module")
def ln_table() -> tolstat.ToleranceTable:
    rng = np.random.default_rng(4)
    ds = tolstat.from_pairs([_ln_run(rng, 16) for _ in range(200)], op="layer_norm", dtype="float16",
                            hardware="cpu", options=tolstat.CollectOptions(progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tolstat.select(ds, fp_budget=0.05)


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
def test_a_check_with_its_invariants_on_the_side_thread_is_the_check_made_in_sequence(monkeypatch, ln_table):
    import tolstat.checks.checking as checking

    calls = []
    real = checking.pass_invariants

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(checking, "pass_invariants", counted)
    assert ln_table.entry("layer_norm", "float16", "cpu").operator
    rng = np.random.default_rng(8)
    for bug in (False, True):
        run = _ln_run(rng, 300)  # 76,800 elements: beyond the calibrated size, invariants carried
        if bug:
            run["actual"] = (run["actual"].astype(np.float32) * np.float32(1.01)).astype(np.float16)
        got = {}
        for side in (False, True):
            monkeypatch.setattr(checking, "INVARIANTS_SIDE_SIZE", 1 if side else 1 << 40)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got[side] = tolstat.check(run["actual"], run["expected"], op="layer_norm", dtype="float16",
                                          table=ln_table, hardware="cpu", inputs=run["inputs"], params=run["params"])
        assert got[True].statistics == got[False].statistics and got[True].passed == got[False].passed
        assert got[True].worst_index == got[False].worst_index and got[True].n_exceeding == got[False].n_exceeding
        assert got[True].passed is (not bug)
    assert len(calls) == 2  # the side path ran once per output


@pytest.mark.skipif(not TWO_CORES, reason="one core: no side work")
def test_an_error_of_the_invariants_on_the_side_thread_is_raised_by_the_check(monkeypatch, ln_table):
    import tolstat.checks.checking as checking

    def broken(*a, **kw):
        raise ValueError("invariant 'row_mean' of op 'layer_norm' returned nan; it must be >= 0")
    monkeypatch.setattr(checking, "pass_invariants", broken)
    monkeypatch.setattr(checking, "INVARIANTS_SIDE_SIZE", 1)
    run = _ln_run(np.random.default_rng(9), 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="returned nan"):
            tolstat.check(run["actual"], run["expected"], op="layer_norm", dtype="float16", table=ln_table,
                          hardware="cpu", inputs=run["inputs"], params=run["params"])
    got = threads.submit_side((abs, (-5,), {}))  # nothing of that check left in flight
    assert got is not None and got[0].result(timeout=30) == 5


def test_a_side_thread_shut_down_at_exit_leaves_the_work_to_the_caller(monkeypatch):
    """At interpreter exit the executor refuses new work: a check or record made then (an
    atexit hook's) computes everything itself instead of failing."""
    from concurrent.futures import ThreadPoolExecutor

    dead = ThreadPoolExecutor(max_workers=1)
    dead.shutdown()
    monkeypatch.setattr(threads, "_STATE", {"pid": os.getpid(), "executor": dead, "busy": 0})
    assert threads.submit_side((abs, (-1,), {}), (abs, (-2,), {})) is None
    assert threads._STATE["busy"] == 0  # nothing counted in flight
    monkeypatch.setattr(runs, "SIDE_WORK_SIZES", (1, 1 << 40))
    x = np.random.default_rng(3).standard_normal((4, COLS)).astype(np.float16)
    ds = tolstat.from_pairs([(_kernel(x, -1), _reference(x, -1))], op="softmax", dtype="float16", hardware="cpu",
                            options=tolstat.CollectOptions(progress=False, magnitude="ref"))
    assert int(ds.sizes["run"]) == 1
