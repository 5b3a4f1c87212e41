"""Coverage table of the certified thresholds (``tolstat.calibration.engine``) on families with known truth.

Runs the full simulation grid of ``tests/_certify_sim.py`` and writes
``benchmarks/results/coverage_certify.md`` (the table in ``docs/guarantees.md``) and
``benchmarks/results/coverage_certify.json``. Usage::

    python benchmarks/coverage_table.py [--repeats-scale 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from _certify_sim import CONFIDENCE, check_cell, grid, run_cell, table  # noqa: E402


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats-scale", type=float, default=1.0, help="multiply every cell's repeats")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cells = []
    for f, n, g, b, j, r in grid():
        cells.append(run_cell(f, n, b, n_stats=j, groups=g, repeats=max(10, int(r * args.repeats_scale))))
        print(f"{f:26s} n={n:5d} groups={g:2d} budget={b:g} stats={j} refused={cells[-1].refused:3d} "
              f"violations={cells[-1].violations:3d}/{cells[-1].accepted}", flush=True)
    secs = time.perf_counter() - t0
    problems = [p for c in cells for p in check_cell(c)]
    md = (f"Confidence {CONFIDENCE}; violation = a calibration whose true FP rate exceeds the budget; "
          f"limit = 1 - confidence + 2 Monte-Carlo s.e. of the accepted calibrations; p(excess) = one-sided "
          f"binomial p-value of a violation probability above 1 - confidence. {len(cells)} cells, "
          f"{secs:.0f} s. Problems: {len(problems)}.\n\n" + table(cells) + "\n")
    _atomic_write(args.out / "coverage_certify.md", md)
    _atomic_write(args.out / "coverage_certify.json", json.dumps(
        {"confidence": CONFIDENCE, "seconds": secs, "problems": problems,
         "cells": [dataclasses.asdict(c) | {"rate": c.rate, "limit": c.limit, "p_excess": c.p_excess}
                   for c in cells]}, indent=1, default=float))
    print(md)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
