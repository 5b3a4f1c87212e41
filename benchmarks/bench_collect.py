"""``tolstat.collect`` against the kernel and reference calls it makes, in the same run.

The speed issue's goal: collection overhead <= 1.5x the kernel plus reference time. For
each case a user kernel (numpy: float32 accumulation stored in float16) and its float64
reference are called on ``make_inputs(rng)`` for ``--runs`` runs

* **baseline**: a plain loop ``make_inputs(rng_i); kernel(*x); reference(*x)`` with the
  same per-run generators ``numpy.random.default_rng([seed, i])`` that ``collect`` uses;
* **collect**: ``tolstat.collect(kernel, reference, make_inputs, op=..., runs=...)`` in
  memory, with the defaults (operator statistics derived from the inputs for a known op,
  element sample of 4,096) and with ``CollectOptions(op_model=False)``.

The two are timed alternately, ``--repeats`` times; each figure is the median. The
ratio is collect / baseline: 1 means collection costs nothing beyond calling the kernel
and its reference. Writes ``benchmarks/results/collect.json`` (atomically), with the load
average at the start and the end.

Usage::

    PYTHONPATH=. python benchmarks/bench_collect.py [--runs 400] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

import tolstat
from tolstat._base.util import atomic_write_text

HERE = Path(__file__).resolve().parent


def _matmul_case(n: int, k: int) -> tuple[Callable[..., Any], Callable[..., Any], Callable[[Any], Any]]:
    def make_inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return (rng.standard_normal((n, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16))

    def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)

    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a.astype(np.float64) @ b.astype(np.float64)

    return kernel, reference, make_inputs


def _softmax_case(rows: int, cols: int) -> tuple[Callable[..., Any], Callable[..., Any], Callable[[Any], Any]]:
    def make_inputs(rng: np.random.Generator) -> tuple[np.ndarray, int]:
        return (rng.standard_normal((rows, cols)).astype(np.float16), -1)

    def kernel(x: np.ndarray, dim: int) -> np.ndarray:
        y = x.astype(np.float32)
        e = np.exp(y - y.max(axis=dim, keepdims=True))
        return (e / e.sum(axis=dim, keepdims=True)).astype(np.float16)

    def reference(x: np.ndarray, dim: int) -> np.ndarray:
        y = x.astype(np.float64)
        e = np.exp(y - y.max(axis=dim, keepdims=True))
        return e / e.sum(axis=dim, keepdims=True)

    return kernel, reference, make_inputs


CASES = {
    "matmul 64x256x64 float16": ("matmul", _matmul_case(64, 256)),
    "matmul 256x256x256 float16": ("matmul", _matmul_case(256, 256)),
    "softmax 64x1024 float16": ("softmax", _softmax_case(64, 1024)),
}


def _baseline(kernel: Callable[..., Any], reference: Callable[..., Any], make_inputs: Callable[[Any], Any],
              runs: int, seed: int = 0) -> None:
    for i in range(runs):
        x = make_inputs(np.random.default_rng([seed, i]))
        kernel(*x)
        reference(*x)


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "collect.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    rows = []
    for name, (op, (kernel, reference, make_inputs)) in CASES.items():
        variants: dict[str, Callable[[], Any]] = {
            "baseline": lambda: _baseline(kernel, reference, make_inputs, args.runs),
            "collect (default)": lambda: tolstat.collect(
                kernel, reference, make_inputs, op=op, dtype="float16", runs=args.runs, hardware="bench",
                options=tolstat.CollectOptions(progress=False)),
            "collect (op_model=False)": lambda: tolstat.collect(
                kernel, reference, make_inputs, op=op, dtype="float16", runs=args.runs, hardware="bench",
                options=tolstat.CollectOptions(progress=False, op_model=False)),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f in variants.values():  # warm-up (numba compilation, caches)
                f()
            for _ in range(args.repeats):
                for k, f in variants.items():
                    times[k].append(_timed(f))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"case": name, "runs": args.runs, **{f"{k} s": v for k, v in med.items()},
               "ratio default": med["collect (default)"] / med["baseline"],
               "ratio op_model=False": med["collect (op_model=False)"] / med["baseline"],
               "per run overhead ms (default)": 1e3 * (med["collect (default)"] - med["baseline"]) / args.runs}
        rows.append(row)
        print(f"{name}: baseline {med['baseline']:.3f} s, collect {med['collect (default)']:.3f} s "
              f"({row['ratio default']:.2f}x), op_model=False {med['collect (op_model=False)']:.3f} s "
              f"({row['ratio op_model=False']:.2f}x); goal <= 1.5x", flush=True)
    res = {"goal": "collect <= 1.5x the kernel plus reference time", "rows": rows,
           "load_start": load0, "load_end": os.getloadavg(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "tolstat": tolstat.__version__}
    atomic_write_text(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
