"""How often correct outputs larger than the calibration runs fail, per op and size.

Run: ``PYTHONPATH=. python benchmarks/size_transfer.py [--runs N]`` (about 1 minute).

The promise covers runs like the calibration runs. A check of an output larger than every
calibration run of its group gets a ``CalibrationRangeWarning``; this measures what the
warning is about. Per op of ``benchmarks/bench_check_inputs.py`` (gelu, elementwise;
matmul with K = 64; softmax and layer_norm, rows of 1,024, with their row statistics and
invariants) one table from 300 float16 runs of 4,096 outputs with ``inputs=`` and the
default ``tolstat.select(ds, fp_budget=0.01)``; then ``N`` fresh correct outputs (default
200) of 1, 4, 16 and 64 times that size, each checked with ``tolstat.check(...,
inputs=, params=)``, the user's call. Reported: the failures, their rate, its 95 %
Clopper-Pearson upper bound (``scipy.stats.binomtest``) and, for the failed checks, the
statistic that tripped first. Writes ``benchmarks/results/size_transfer.md`` and ``.json``
(atomically).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

import tolstat
from tolstat._base.util import atomic_write_text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_check_inputs as B  # noqa: E402  (the ops and the table of the check benchmark)

RESULTS = HERE / "results"
BASE = 4096
FACTORS = (1, 4, 16, 64)


def _tripped(r: tolstat.CheckResult) -> str:
    """The statistic with the largest share of its threshold (``op_score``'s members)."""
    shares = {k: r.statistics[k] / r.thresholds[k] for k in r.thresholds
              if k != "op_score" and r.thresholds[k] > 0}
    return max(shares, key=shares.get) if shares else "op_score"


def measure(runs: int) -> dict:
    rows = []
    for name, op in B.OPS.items():
        table = B._table(op)
        for f in FACTORS:
            n = BASE * f
            fails, which = 0, collections.Counter()
            for i in range(runs):
                x = op.make(np.random.default_rng([7, n, i]), n)
                r = tolstat.check(op.kernel(*x), op.reference(*x), op=name, dtype="float16", table=table,
                                  hardware="bench", inputs=x, params=op.params)
                if not r.passed:
                    fails += 1
                    which[_tripped(r)] += 1
            ub = binomtest(fails, runs).proportion_ci(0.95, method="exact").high
            rows.append(dict(op=name, n=n, factor=f, runs=runs, fails=fails, rate=fails / runs, upper=ub,
                             tripped=dict(which.most_common())))
            print(f"{name:<10s} x{f:<3d} {n:>8,d} outputs: {fails}/{runs} fail "
                  f"({100 * fails / runs:.1f}%, 95% upper {100 * ub:.1f}%) {dict(which.most_common(3))}", flush=True)
    return dict(rows=rows, budget=0.01, base=BASE, tolstat=tolstat.__version__)


def _markdown(res: dict) -> str:
    lines = ["# Correct outputs larger than the calibration runs", "",
             "Written by `benchmarks/size_transfer.py`: per op one table from 300 float16 runs of "
             f"{res['base']:,} outputs (`inputs=`, default `select`, budget {res['budget']:g}), then fresh "
             "correct outputs of 1-64 times that size checked with `check(..., inputs=, params=)`. "
             "A larger output is outside the promise (`CalibrationRangeWarning`).", "",
             "| op | outputs | x calibration size | failed | rate | 95% upper | statistic that tripped |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        trip = ", ".join(f"{k} {v}" for k, v in r["tripped"].items()) or "-"
        lines.append(f"| {r['op']} | {r['n']:,} | {r['factor']} | {r['fails']}/{r['runs']} | "
                     f"{100 * r['rate']:.1f}% | {100 * r['upper']:.1f}% | {trip} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="correct outputs per op and size (default 1000)")
    ap.add_argument("--out", default=str(RESULTS / "size_transfer.md"), help="markdown output")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs must be >= 1, got {args.runs}")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CalibrationRangeWarning of every larger output
        res = measure(args.runs)
    res["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    atomic_write_text(out, _markdown(res))
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    print(f"wrote {out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
