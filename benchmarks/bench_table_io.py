"""Writing, reading, showing and diffing a tolerance table scale linearly with its groups.

Run: ``PYTHONPATH=. python benchmarks/bench_table_io.py [--small 2000] [--large 20000]
[--kind operator|scale|plain] [--repeats 3] [--gc-off] [--json PATH]``.

Builds synthetic tables (``ToleranceTable.from_groups`` of group dicts like those of
``tests/table_helpers.py``: an operator-form certificate, a scale model or a plain
statistic per group) of ``--small`` and ``--large`` groups and times, on each:

* ``save``: :meth:`ToleranceTable.to_json` (the reviewable layout, with checksums);
* ``load``: :func:`tolstat.load_table` of that file (validation and checksum verification);
* ``show``: ``tolstat show FILE`` (:func:`tolstat.cli.main.main`, output discarded);
* ``diff``: ``tolstat diff FILE FILE2`` against a copy with every threshold changed.

It prints each time and the ratio ``time(large) / time(small)``: linear work gives the
ratio of the group counts (10 for the defaults), quadratic work its square (100). Times
are the medians of ``--repeats`` runs. Python's cyclic garbage collector costs more per
object the more objects are alive, which lifts the ratios somewhat above 10 (up to about
16 measured on a loaded 2-core machine); ``--gc-off`` times with it disabled.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from tolstat.calibration.table import ToleranceTable, load_table
from tolstat.cli.main import main as cli

OPS = ("matmul", "softmax", "rowsum", "gelu", "add")


def _group(i: int, kind: str, shift: float) -> dict[str, Any]:
    op, dtype, hw = f"{OPS[i % len(OPS)]}_{i // len(OPS):05d}", ("float16", "bfloat16")[i % 2], f"gpu{i % 3}"
    thr = 1.0 + (i % 97) / 97 + shift
    statistic = {"operator": "op_score", "scale": "max_score", "plain": "max_abs"}[kind]
    g: dict[str, Any] = {
        "op": op, "dtype": dtype, "hardware": hw, "n": 400, "scale": None,
        "statistics": {statistic: {"threshold": thr, "estimate": thr, "budget": 0.01, "confidence": 0.95,
                                   "method": "order_statistic", "reason": "synthetic", "tail": {},
                                   "top_scores": [thr, 0.9 * thr, 0.8 * thr]}},
    }
    if kind == "operator":
        g["certificate"] = {"form": "operator", "method": "order_statistic", "guarantee": "PAC: synthetic",
                            "normalisers": {"op_max": 2.0 + i % 7, "op_rms": 1.0, "op_bias": 0.5},
                            "rowwise": False, "needs_magnitude": True, "covariates": ["K"], "n_scores": 400}
    elif kind == "scale":
        g["scale"] = {"form": "size_aware", "atol": 0.5, "rtol": 0.25, "unit": 1e-3, "linear": {"ref_rms": 1.0},
                      "power": {"K": [0.5, 64.0]}}
    return g


def _table(n: int, kind: str, shift: float = 0.0) -> ToleranceTable:
    stat = {"operator": "op_score", "scale": "max_score", "plain": "max_abs"}[kind]
    return ToleranceTable.from_groups([_group(i, kind, shift) for i in range(n)],
                                      {"fp_budget": 0.01, "confidence": 0.95, "statistics": [stat]})


def _median(f: Callable[[], Any], repeats: int, gc_off: bool = False) -> float:
    ts = []
    for _ in range(repeats):
        gc.collect()
        if gc_off:
            gc.disable()
        try:
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        finally:
            gc.enable()
    return statistics.median(ts)


def _quiet(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli(argv)
    if rc != 0:
        raise RuntimeError(f"tolstat {' '.join(argv)} exited with {rc}")


def measure(n: int, kind: str, repeats: int, folder: Path, gc_off: bool = False) -> dict[str, float]:
    """Seconds of save, load, show and diff of a table of ``n`` groups."""
    a, b = folder / f"a{n}.json", folder / f"b{n}.json"
    t = _table(n, kind)
    _table(n, kind, shift=0.5).to_json(b)
    return {
        "save": _median(lambda: t.to_json(a), repeats, gc_off),
        "load": _median(lambda: load_table(a), repeats, gc_off),
        "show": _median(lambda: _quiet(["show", str(a)]), repeats, gc_off),
        "diff": _median(lambda: _quiet(["diff", str(a), str(b)]), repeats, gc_off),
    }


def run(small: int, large: int, kind: str, repeats: int, gc_off: bool = False) -> dict[str, Any]:
    """Times at both sizes and their ratios."""
    with tempfile.TemporaryDirectory() as d:
        ts = measure(small, kind, repeats, Path(d), gc_off)
        tl = measure(large, kind, repeats, Path(d), gc_off)
    return {"small": small, "large": large, "kind": kind, "repeats": repeats, "gc_off": gc_off, "seconds_small": ts,
            "seconds_large": tl, "ratio": {k: tl[k] / ts[k] for k in ts},
            "linear_ratio": large / small, "quadratic_ratio": (large / small) ** 2,
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--large", type=int, default=20000)
    p.add_argument("--kind", choices=("operator", "scale", "plain"), default="operator")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gc-off", action="store_true", help="disable the cyclic garbage collector while timing")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    res = run(args.small, args.large, args.kind, args.repeats, args.gc_off)
    print(f"tolerance table IO, {args.kind} groups: {args.small} vs {args.large} (linear ratio "
          f"{res['linear_ratio']:g}, quadratic {res['quadratic_ratio']:g})")
    print(f"{'step':6s} {'small s':>9s} {'large s':>9s} {'ratio':>7s}")
    for k, r in res["ratio"].items():
        print(f"{k:6s} {res['seconds_small'][k]:9.3f} {res['seconds_large'][k]:9.3f} {r:7.2f}")
    if args.json:
        from tolstat._base.util import atomic_write_text

        atomic_write_text(args.json, json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
