"""Calibrating many small groups, and the IO of the pooled table, scale linearly with the groups.

Run: ``PYTHONPATH=. python benchmarks/bench_many_groups.py [--small 500] [--large 2000]
[--runs 30] [--json PATH]``.

Builds, through the public API (``tolstat.from_pairs``), ``--small`` and ``--large`` groups
of ``--runs`` fp16 runs each (16 elements, one law, so every group is too small for its own
order statistic at budget 5 % and borrows from the pool of all groups: the case where each
pooled group used to test itself against a rebuilt rest of the pool and list the whole
pool in its certificate). On each it times ``tolstat.select`` (default call, budget 5 %),
``ToleranceTable.to_json``, ``tolstat.load_table`` and ``tolstat show``/``tolstat diff``
(:func:`tolstat.cli.main.main` in this process, output discarded), and prints the ratio
``time(large) / time(small)``: linear work gives the ratio of the group counts (4 for the
defaults), quadratic work its square (16). The table file's size ratio is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import tolstat
from tolstat.cli.main import main as cli


def errors(n_groups: int, runs: int, seed: int = 0) -> Any:
    """``n_groups`` exchangeable groups of ``runs`` plain fp16 runs (``from_pairs``)."""
    rng = np.random.default_rng(seed)
    n = n_groups * runs
    e = rng.standard_normal((n, 16))
    a = (e + rng.standard_normal((n, 16)) * 1e-3).astype(np.float16)
    ds = tolstat.from_pairs([(a[i], e[i]) for i in range(n)], op="x", dtype="fp16",
                            options=tolstat.CollectOptions(sample_size=16))
    return ds.assign_coords(op=("run", np.array([f"op{i // runs:06d}" for i in range(n)])))


def _timed(f: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def _quiet(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        if cli(argv) != 0:
            raise RuntimeError(f"tolstat {' '.join(argv)} failed")


def measure(n_groups: int, runs: int, folder: Path) -> dict[str, float]:
    """Seconds of select, save, load, show and diff for ``n_groups`` groups, and the file size."""
    ds = errors(n_groups, runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_sel, table = _timed(lambda: tolstat.select(ds, fp_budget=0.05))
    a, b = folder / f"a{n_groups}.json", folder / f"b{n_groups}.json"
    t_save, _ = _timed(lambda: table.to_json(a))
    table.to_json(b)  # diff of two equal tables: every group compared
    t_load, _ = _timed(lambda: tolstat.load_table(a))
    t_show, _ = _timed(lambda: _quiet(["show", str(a)]))
    t_diff, _ = _timed(lambda: _quiet(["diff", str(a), str(b)]))
    return {"select": t_sel, "save": t_save, "load": t_load, "show": t_show, "diff": t_diff,
            "bytes": float(a.stat().st_size)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", type=int, default=500)
    p.add_argument("--large", type=int, default=2000)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        ts = measure(args.small, args.runs, Path(d))
        tl = measure(args.large, args.runs, Path(d))
    ratio = {k: tl[k] / ts[k] for k in ts}
    print(f"{args.small} -> {args.large} groups of {args.runs} runs (linear ratio {args.large / args.small:g}, "
          f"quadratic {(args.large / args.small) ** 2:g}); load average {os.getloadavg()[0]:.1f}")
    for k in ts:
        unit = "MB" if k == "bytes" else "s"
        f = 1e-6 if k == "bytes" else 1.0
        print(f"  {k:7s} {ts[k] * f:9.3f} {unit} -> {tl[k] * f:9.3f} {unit}   ratio {ratio[k]:.2f}")
    if args.json:
        from tolstat._base.util import atomic_write_text

        atomic_write_text(args.json, json.dumps({"small": args.small, "large": args.large, "runs": args.runs,
                                                 "seconds_small": ts, "seconds_large": tl, "ratio": ratio,
                                                 "loadavg": os.getloadavg()[0]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
