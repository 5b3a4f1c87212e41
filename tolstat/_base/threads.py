"""Work on a second core: one side thread per process, for work whose result is the same
whichever thread computes it and that releases the GIL (numba kernels with ``nogil``,
numpy's loops, hashing).

A caller hands a few calls to the side thread with :func:`submit_side`, computes its own
share, then reads their results. The side thread takes one caller's calls at a time: a
caller that finds it busy (another thread's check or record) gets None and computes
everything itself, so concurrent callers never wait on each other's work. The calls run
in the caller's context (its context variables and :func:`numpy.errstate`, which a
thread does not inherit). A forked child makes its own thread.

Layer: base (imports nothing of tolstat).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

__all__ = ["cores", "submit_side", "settled_on_error", "settle"]

#: the process's side thread: (process id, executor or None, calls in flight)
_STATE: dict[str, Any] = {"pid": None, "executor": None, "busy": 0}
_LOCK = threading.Lock()


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _executor() -> ThreadPoolExecutor | None:
    """The process's one-thread executor, or None with one core (made on first use, and
    again in a forked child: the parent's thread is not there)."""
    if _STATE["pid"] != os.getpid():
        with _LOCK:
            if _STATE["pid"] != os.getpid():
                ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tolstat-side") if cores() >= 2 else None
                _STATE.update(executor=ex, busy=0, pid=os.getpid())
    return _STATE["executor"]


def _done(_: Future) -> None:
    with _LOCK:
        _STATE["busy"] -= 1


def _as_caller(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Callable[[], Any]:
    """``fn(*args, **kwargs)`` as a call that runs in the caller's context and numpy error handling."""
    err = np.geterr()
    ctx = contextvars.copy_context()

    def call() -> Any:
        with np.errstate(**err):
            return fn(*args, **kwargs)
    return lambda: ctx.run(call)


def submit_side(*calls: tuple[Callable[..., Any], Sequence[Any], Mapping[str, Any]]) -> list[Future] | None:
    """Hand ``calls`` (each ``(fn, args, kwargs)``) to the side thread, which runs them in
    order; their futures, or None (the caller computes them itself) in a process with one
    core or while the side thread holds another caller's calls."""
    ex = _executor()
    if ex is None or not calls:
        return None
    with _LOCK:
        if _STATE["busy"]:
            return None
        _STATE["busy"] = len(calls)
    futures: list[Future] = []
    try:
        for fn, args, kwargs in calls:
            f = ex.submit(_as_caller(fn, args, kwargs))
            f.add_done_callback(_done)
            futures.append(f)
    except BaseException as exc:
        with _LOCK:  # the calls not handed over are not in flight
            _STATE["busy"] -= len(calls) - len(futures)
        settle(futures)
        if isinstance(exc, RuntimeError):  # an executor shut down (interpreter exit): the caller computes them
            return None
        raise
    return futures


def settle(futures: Sequence[Future] | None) -> None:
    """No call of ``futures`` left running: each is cancelled or waited for (what it
    raised is dropped)."""
    for f in futures or ():
        if not f.cancel():
            try:
                f.result()
            except BaseException:
                pass


@contextlib.contextmanager
def settled_on_error(futures: Sequence[Future] | None) -> Iterator[None]:
    """Where the block raises, :func:`settle` ``futures`` before the block's error goes on."""
    try:
        yield
    except BaseException:
        settle(futures)
        raise
