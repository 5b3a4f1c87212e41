"""How often correct outputs larger than the calibration runs fail, per op and size.

Run: ``PYTHONPATH=. python benchmarks/size_transfer.py [--runs N]`` (about 2 minutes).

The promise covers runs like the calibration runs. A check of an output larger than every
calibration run of its group gets a ``CalibrationRangeWarning``; this measures what the
warning is about. Per op of ``benchmarks/bench_check_inputs.py`` (gelu, elementwise;
matmul with K = 64; softmax and layer_norm, rows of 1,024, with their row statistics and
invariants) one table from 300 float16 runs of 4,096 outputs with ``inputs=`` and the
default ``tolstat.select(ds, fp_budget=0.01)``; then ``N`` fresh correct outputs (default
200) of 1, 4, 16 and 64 times that size, each checked with ``tolstat.check(...,
inputs=, params=)``, the user's call, twice: with the table as ``select`` made it (a
check of an output with more rows than every calibration run carries its row invariants
and row bias to its rows, ``tolstat.measure.noise.row_extrapolation``) and with the same
table without its ``rows_max`` (the maxima as calibrated, what tables written before it
do). Reported per variant: the failures, their rate, its 95 % Clopper-Pearson upper bound
(``scipy.stats.binomtest``) and, for the failed checks, the statistic that tripped first. Writes ``benchmarks/results/size_transfer.md`` and ``.json``
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


def _without_rows_max(table: tolstat.ToleranceTable) -> tolstat.ToleranceTable:
    d = table.to_dict()
    for g in d["groups"]:
        g["certificate"].pop("rows_max", None)
    return tolstat.ToleranceTable.from_groups(d.pop("groups"), d)


VARIANTS = ("extrapolated", "as calibrated")


def measure(runs: int) -> dict:
    rows = []
    for name, op in B.OPS.items():
        table = B._table(op)
        tables = {"extrapolated": table, "as calibrated": _without_rows_max(table)}
        for f in FACTORS:
            n = BASE * f
            fails = dict.fromkeys(VARIANTS, 0)
            which: dict[str, collections.Counter] = {v: collections.Counter() for v in VARIANTS}
            for i in range(runs):
                x = op.make(np.random.default_rng([7, n, i]), n)
                a, e = op.kernel(*x), op.reference(*x)
                for v, t in tables.items():
                    r = tolstat.check(a, e, op=name, dtype="float16", table=t, hardware="bench", inputs=x,
                                      params=op.params)
                    if not r.passed:
                        fails[v] += 1
                        which[v][_tripped(r)] += 1
            row = dict(op=name, n=n, factor=f, runs=runs)
            for v in VARIANTS:
                ub = binomtest(fails[v], runs).proportion_ci(0.95, method="exact").high
                row[v] = dict(fails=fails[v], rate=fails[v] / runs, upper=ub, tripped=dict(which[v].most_common()))
            rows.append(row)
            print(f"{name:<10s} x{f:<3d} {n:>8,d} outputs: " + "; ".join(
                f"{v} {row[v]['fails']}/{runs} ({100 * row[v]['rate']:.1f}%, 95% upper {100 * row[v]['upper']:.1f}%)"
                for v in VARIANTS), flush=True)
    return dict(rows=rows, budget=0.01, base=BASE, tolstat=tolstat.__version__)


def _markdown(res: dict) -> str:
    lines = ["# Correct outputs larger than the calibration runs", "",
             "Written by `benchmarks/size_transfer.py`: per op one table from 300 float16 runs of "
             f"{res['base']:,} outputs (`inputs=`, default `select`, budget {res['budget']:g}), then fresh "
             "correct outputs of 1-64 times that size checked with `check(..., inputs=, params=)`: *extrapolated* "
             "with the table as `select` made it (the row invariants and row bias of an output with more rows than "
             "calibrated carried to its rows, model-based), *as calibrated* with the same table without its "
             "`rows_max`. A larger output is outside the promise (`CalibrationRangeWarning`).", "",
             "| op | outputs | x calibration size | extrapolated: failed | rate | 95% upper | tripped "
             "| as calibrated: failed | rate | 95% upper | tripped |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in res["rows"]:
        cells = []
        for v in VARIANTS:
            c = r[v]
            trip = ", ".join(f"{k} {n}" for k, n in c["tripped"].items()) or "-"
            cells.append(f"{c['fails']}/{r['runs']} | {100 * c['rate']:.1f}% | {100 * c['upper']:.1f}% | {trip}")
        lines.append(f"| {r['op']} | {r['n']:,} | {r['factor']} | " + " | ".join(cells) + " |")
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
