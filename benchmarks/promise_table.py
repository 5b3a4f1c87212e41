"""End-to-end promise table: ``select``'s tables against fresh correct runs, through the public API.

Runs the grid of ``tests/_promise_sim.py`` (families of correct kernels with a known error
law -> ``tolstat.from_pairs`` -> ``tolstat.select`` -> ``tolstat.check`` on M fresh runs),
prints a Markdown table (cell, form, n, budget, calibrations, refused %, violation %, the
limit ``1 - g + 2 s.e.``, the expected inflation of estimating FP from M runs, mean FP)
and writes it as JSON and ``.md`` (atomically: a temporary file, then ``os.replace``).
Progress goes to stderr. Usage::

    python benchmarks/promise_table.py --quick
    python benchmarks/promise_table.py [--reps 100] [--fresh M | --fresh-factor 20] [--fresh-set per-calibration] \\
        [--cells 'light/*/default/*'] [--jobs 2] [--check-runs] [--out benchmarks/results/promise.json]

Exit status 1 when a cell breaks the promise or its refusal expectation (see
``_promise_sim.expected_outcome``).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import _promise_sim as ps  # noqa: E402

from tolstat._base.util import atomic_write_text  # noqa: E402


def _run(batch: ps.Batch, names: list[str], vectorised: bool) -> list[ps.CellResult]:
    t0 = time.perf_counter()
    ps._stderr(f"start {batch.family}/{batch.path}/n={batch.n}: {len(names)} cells x {batch.reps} calibrations")
    out = ps.run_batch(batch, cells=names, vectorised=vectorised, progress=ps._stderr)
    for c in out:
        ps._stderr(f"done  {c.summary()} [{time.perf_counter() - t0:.1f} s]")
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few-minute subset of the grid")
    ap.add_argument("--reps", type=int, default=None, help="calibrations R per cell (default: 100; --quick 12)")
    ap.add_argument("--fresh", type=int, default=None, help="fresh runs M per cell (default: ceil(factor / budget))")
    ap.add_argument("--fresh-factor", type=float, default=None,
                    help="M = ceil(factor / budget) (default 20, 100 with --check-runs; --quick 10)")
    ap.add_argument("--fresh-set", choices=("shared", "per-calibration"), default=None,
                    help="one fresh set per cell, or a new one for every calibration (independent violations); "
                         "default: shared with --check-runs, else per-calibration")
    ap.add_argument("--cells", action="append", default=None,
                    help="glob over cell names family/path/form/n=N/a=BUDGET (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="batches run in parallel processes")
    ap.add_argument("--check-runs", action="store_true",
                    help="decide fresh runs with tolstat.check_runs (cross-checked with tolstat.check once per cell); "
                         "also set by TOLSTAT_PROMISE_CHECK_RUNS=1")
    ap.add_argument("--list", action="store_true", help="list the selected cells and exit")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "promise.json")
    args = ap.parse_args(argv)

    vec = ps.use_check_runs(args.check_runs or None)
    batches = ps.quick_batches(vectorised=vec) if args.quick else ps.full_batches(vectorised=vec)
    repl = {}
    if args.reps is not None:
        repl["reps"] = args.reps
    if args.fresh_factor is not None:
        repl["fresh_factor"] = args.fresh_factor
    if args.fresh is not None:
        repl["fresh"] = args.fresh
    if args.fresh_set is not None:
        repl["fresh_per_calibration"] = args.fresh_set == "per-calibration"
    batches = [dataclasses.replace(b, **repl) for b in batches]
    todo = ps.select_cells(batches, args.cells)
    if args.list:
        for b, names in todo:
            print("\n".join(names))
        return 0
    if not todo:
        ps._stderr(f"no cell matches {args.cells}")
        return 2
    t0 = time.perf_counter()
    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")  # numba's and BLAS's thread pools are not fork-safe
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as ex:
            futs = [ex.submit(_run, b, names, vec) for b, names in todo]
            results = [c for f in futs for c in f.result()]
    else:
        results = [c for b, names in todo for c in _run(b, names, vec)]
    secs = time.perf_counter() - t0
    bad = [c for c in results if not c.ok]
    import tolstat

    md = (f"End-to-end promise of `tolstat.select` (tolstat {tolstat.__version__}): confidence "
          f"{ps.CONFIDENCE}; violation % = share of non-refused calibrations whose FP, estimated by "
          f"{'tolstat.check_runs' if vec else 'tolstat.check'} on M fresh correct runs, exceeds the budget; "
          f"limit = 1 - g + 2 Monte-Carlo s.e.; inflation = expected excess of the violation rate from "
          f"estimating FP on M runs (exact order statistic reference); sig. viol. % = violations by a one-sided "
          f"binomial test at level {ps.SIG_LEVEL}; ok = no error, violation % <= limit + inflation (else "
          f"'over limit' with the binomial p-value against 1 - g + inflation; **NO** when p < {ps.P_BREAK:g}) and "
          f"refusals as expected. {len(results)} cells, {secs:.0f} s, {len(bad)} not ok.\n\n"
          + ps.markdown_table(results) + "\n")
    out = args.out if args.out.suffix == ".json" else args.out.with_suffix(".json")
    atomic_write_text(out, ps.results_json(results, confidence=ps.CONFIDENCE, seconds=secs, quick=args.quick,
                                       check="check_runs" if vec else "check", argv=sys.argv[1:] if argv is None
                                       else list(argv), tolstat_version=tolstat.__version__) + "\n")
    atomic_write_text(out.with_suffix(".md"), md)
    print(md)
    ps._stderr(f"wrote {out} and {out.with_suffix('.md')} ({secs:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
