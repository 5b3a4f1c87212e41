"""How often correct outputs larger than the calibration runs fail, per op and size.

Run: ``PYTHONPATH=. python benchmarks/size_transfer.py [--runs N] [--recall-runs M]`` (about 5 minutes).

The promise covers runs like the calibration runs. A check of an output larger than every
calibration run of its group gets a ``CalibrationRangeWarning``; this measures what the
warning is about. Per op of ``benchmarks/bench_check_inputs.py`` (gelu, elementwise;
matmul with K = 64; softmax and layer_norm, rows of 1,024, with their row statistics and
invariants) one table from 300 float16 runs of 4,096 outputs with ``inputs=`` and the
default ``tolstat.select(ds, fp_budget=0.01)``; then ``N`` fresh correct outputs (default
1000) of 1, 4, 16 and 64 times that size, each checked with ``tolstat.check(...,
inputs=, params=)``, the user's call, twice: with the table as ``select`` made it (a
check of an output larger than every calibration run carries its row invariants and row
bias to its rows and reads its whole-output bias at the calibrated size,
``tolstat.measure.noise.beyond_calibration``) and with the same table without its
calibrated size (``rows_max``, ``n_elements_max``: nothing carried, what tables written
before them do). Reported per variant: the failures, their rate, its 95 % Clopper-Pearson upper bound
(``scipy.stats.binomtest``) and, for the failed checks, the statistic that tripped first.

Then the common path, plain ``(actual, expected)`` pairs: the same calibration runs
without their inputs (the default ``select`` fits a scale form, whose decision is the
largest normalised error) and ``N`` fresh correct outputs of each size, checked with
``check(actual, expected, ...)`` against the table (the largest error of a larger output
carried to its size, ``tolstat.calibration.decision.beyond_calibrated_size``) and against
the same table without ``n_elements_max`` (nothing carried).

Then what the extrapolation costs in recall: for softmax (a denominator summed from
float16-rounded terms) and layer_norm (``eps = 5e-5`` instead of ``1e-5``), ``--recall-runs``
correct and buggy outputs of 64 rows of 1,024 (default 300 each) checked against the table
of 4-row runs with and without its calibrated size and against a table calibrated the same way on
64-row runs (the size checked), with ``inputs=`` and as plain pairs. Writes ``benchmarks/results/size_transfer.md`` and ``.json``
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


def _as_calibrated(table: tolstat.ToleranceTable) -> tolstat.ToleranceTable:
    """``table`` without the calibrated size (``rows_max``, ``n_elements_max``): a larger
    output's statistics as calibrated, nothing carried (as tables written before them)."""
    d = table.to_dict()
    for g in d["groups"]:
        g["certificate"].pop("rows_max", None)
        g["certificate"].pop("n_elements_max", None)
    return tolstat.ToleranceTable.from_groups(d.pop("groups"), d)


VARIANTS = ("extrapolated", "as calibrated")
RECALL_ROWS = (4, 64)


def _softmax_lowp_denominator(x: np.ndarray, dim: int = -1) -> np.ndarray:
    """softmax whose denominator sums the float16-rounded terms (each term rounded once more)."""
    y = x.astype(np.float32)
    e = np.exp(y - y.max(axis=dim, keepdims=True))
    return (e / e.astype(np.float16).astype(np.float32).sum(axis=dim, keepdims=True)).astype(np.float16)


def _layer_norm_eps_5e5(x: np.ndarray, shape: tuple, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """layer_norm with ``eps = 5e-5`` whatever it is given."""
    return B._layer_norm(x.astype(np.float32), shape, w.astype(np.float32), b.astype(np.float32),
                         eps=5e-5).astype(np.float16)


BUGS = {"softmax": ("denominator of float16-rounded terms", _softmax_lowp_denominator),
        "layer_norm": ("eps 5e-5 instead of 1e-5", _layer_norm_eps_5e5)}


def _table_of_rows(op: "B.Op", rows: int, seed: int, plain: bool = False) -> tolstat.ToleranceTable:
    pairs = []
    for i in range(300):
        x = op.make(np.random.default_rng([seed, rows, i]), 1024 * rows)
        if plain:
            pairs.append((op.kernel(*x), op.reference(*x)))
        else:
            pairs.append({"actual": op.kernel(*x), "expected": op.reference(*x), "inputs": x, "params": op.params})
    ds = tolstat.from_pairs(pairs, op=op.name, dtype="float16", hardware="bench",
                            options=tolstat.CollectOptions(progress=False))
    return tolstat.select(ds, fp_budget=0.01)


def recall(runs: int) -> list[dict]:
    """False positives and recall at 64 rows: tables of 4-row runs (extrapolated, as
    calibrated) and of 64-row runs."""
    out = []
    for name, (bug, kernel) in BUGS.items():
        op = B.OPS[name]
        small = _table_of_rows(op, RECALL_ROWS[0], 1)
        small_plain = _table_of_rows(op, RECALL_ROWS[0], 1, plain=True)
        tables = {"4 rows, extrapolated": small, "4 rows, as calibrated": _as_calibrated(small),
                  "64 rows (the size checked)": _table_of_rows(op, RECALL_ROWS[1], 2),
                  "plain pairs, 4 rows, extrapolated": small_plain,
                  "plain pairs, 4 rows, as calibrated": _as_calibrated(small_plain),
                  "plain pairs, 64 rows (the size checked)": _table_of_rows(op, RECALL_ROWS[1], 2, plain=True)}
        for tname, t in tables.items():
            fp = caught = 0
            for i in range(runs):
                x = op.make(np.random.default_rng([99, i]), 1024 * RECALL_ROWS[1])
                kw = dict(op=name, dtype="float16", table=t, hardware="bench")
                if not tname.startswith("plain"):
                    kw.update(inputs=x, params=op.params)
                e = op.reference(*x)
                fp += not tolstat.check(op.kernel(*x), e, **kw).passed
                caught += not tolstat.check(kernel(*x, **(op.params or {})), e, **kw).passed
            out.append(dict(op=name, bug=bug, table=tname, runs=runs, fp=fp, caught=caught))
            print(f"{name:<10s} {tname:<40s} false positives {fp}/{runs}, {bug}: caught {caught}/{runs}", flush=True)
    return out


def measure(runs: int) -> dict:
    rows = []
    for name, op in B.OPS.items():
        table = B._table(op)
        tables = {"extrapolated": table, "as calibrated": _as_calibrated(table)}
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


def plain_pairs(runs: int) -> list[dict]:
    """The common path, plain ``(actual, expected)`` pairs: per op one table from the same
    300 runs without their inputs (``from_pairs`` of pairs, the default ``select``: a scale
    form), then ``runs`` fresh correct outputs of each size checked with ``check(actual,
    expected, ...)`` against the table (an output larger than every calibration run has its
    largest error carried to its size, ``tolstat.calibration.decision.beyond_calibrated_size``)
    and against the same table without ``n_elements_max`` (nothing carried)."""
    rows = []
    for name, op in B.OPS.items():
        pairs = []
        for i in range(300):
            x = op.make(np.random.default_rng([0, i]), BASE)
            pairs.append((op.kernel(*x), op.reference(*x)))
        ds = tolstat.from_pairs(pairs, op=name, dtype="float16", hardware="bench",
                                options=tolstat.CollectOptions(progress=False))
        table = tolstat.select(ds, fp_budget=0.01)
        tables = {"extrapolated": table, "as calibrated": _as_calibrated(table)}
        form = table.entry(name, "float16", "bench").certificate["form"]
        for f in FACTORS:
            n = BASE * f
            fails = dict.fromkeys(VARIANTS, 0)
            for i in range(runs):
                x = op.make(np.random.default_rng([7, n, i]), n)
                a, e = op.kernel(*x), op.reference(*x)
                for v, t in tables.items():
                    fails[v] += not tolstat.check(a, e, op=name, dtype="float16", table=t, hardware="bench").passed
            row = dict(op=name, form=form, n=n, factor=f, runs=runs)
            for v in VARIANTS:
                ub = binomtest(fails[v], runs).proportion_ci(0.95, method="exact").high
                row[v] = dict(fails=fails[v], rate=fails[v] / runs, upper=ub)
            rows.append(row)
            print(f"plain pairs {name:<10s} ({form}) x{f:<3d} {n:>8,d} outputs: " + "; ".join(
                f"{v} {row[v]['fails']}/{runs} ({100 * row[v]['rate']:.1f}%, 95% upper {100 * row[v]['upper']:.1f}%)"
                for v in VARIANTS), flush=True)
    return rows


def _markdown(res: dict) -> str:
    lines = ["# Correct outputs larger than the calibration runs", "",
             "Written by `benchmarks/size_transfer.py`: per op one table from 300 float16 runs of "
             f"{res['base']:,} outputs (`inputs=`, default `select`, budget {res['budget']:g}), then fresh "
             "correct outputs of 1-64 times that size checked with `check(..., inputs=, params=)`: *extrapolated* "
             "with the table as `select` made it (the row invariants and row bias of an output with more rows than "
             "calibrated carried to its rows, model-based, and its whole-output bias read at the calibrated size), "
             "*as calibrated* with the same table without `rows_max` and `n_elements_max` (nothing carried). A "
             "larger output is outside the promise (`CalibrationRangeWarning`).", "",
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
    lines += ["", "## Plain pairs", "",
              "The same 300 calibration runs as plain `(actual, expected)` pairs (no `inputs=`): the default `select` "
              "fits a scale form, whose `max_score` is the largest `|d| / s` over the output; fresh correct outputs "
              "checked with `check(actual, expected, ...)`: *extrapolated* with the table as `select` made it (the "
              "largest error of an output larger than every calibration run carried to its size, model-based), *as "
              "calibrated* without `n_elements_max` (nothing carried).", "",
              "| op | form | outputs | x calibration size | extrapolated: failed | rate | 95% upper "
              "| as calibrated: failed | rate | 95% upper |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res.get("plain", []):
        cells = [f"{r[v]['fails']}/{r['runs']} | {100 * r[v]['rate']:.1f}% | {100 * r[v]['upper']:.1f}%"
                 for v in VARIANTS]
        lines.append(f"| {r['op']} | {r['form']} | {r['n']:,} | {r['factor']} | " + " | ".join(cells) + " |")
    lines += ["", "## Recall at 64 rows", "",
              "Correct and buggy outputs of 64 rows of 1,024 against a table of 4-row runs (extrapolated, and as "
              "calibrated) and a table of 64-row runs, 300 calibration runs each, with `inputs=` and as plain pairs.", "",
              "| op | table | false positives | bug | caught |", "|---|---|---:|---|---:|"]
    for r in res.get("recall", []):
        lines.append(f"| {r['op']} | {r['table']} | {r['fp']}/{r['runs']} | {r['bug']} | {r['caught']}/{r['runs']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="correct outputs per op and size (default 1000)")
    ap.add_argument("--recall-runs", type=int, default=300,
                    help="correct and buggy outputs of 64 rows per op and table (default 300)")
    ap.add_argument("--out", default=str(RESULTS / "size_transfer.md"), help="markdown output")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs must be >= 1, got {args.runs}")
    if args.recall_runs < 1:
        ap.error(f"--recall-runs must be >= 1, got {args.recall_runs}")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CalibrationRangeWarning of every larger output
        res = measure(args.runs)
        res["plain"] = plain_pairs(args.runs)
        res["recall"] = recall(args.recall_runs)
    res["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    atomic_write_text(out, _markdown(res))
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    print(f"wrote {out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
