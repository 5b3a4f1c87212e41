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
    python benchmarks/promise_table.py --merge RUN1.json RUN2.json ... --out benchmarks/results/promise_full.json

Exit status 1 when a cell breaks the promise or its refusal expectation (see
``_promise_sim.expected_outcome``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
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
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON", default=None,
                    help="merge the results of several runs (their JSON files) into --out and stop")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "promise.json")
    args = ap.parse_args(argv)

    if args.merge:
        return merge(args.merge, args.out)
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


def _cell(d: dict) -> ps.CellResult:
    """A :class:`CellResult` from its JSON (``to_dict``; derived keys dropped, null as NaN)."""
    names = {f.name for f in dataclasses.fields(ps.CellResult)}
    kw = {k: (float("nan") if v is None else v) for k, v in d.items() if k in names}
    kw["fps"] = [float("nan") if v is None else v for v in kw.get("fps", [])]
    return ps.CellResult(**kw)


def merge(paths: list[Path], out: Path) -> int:
    """Merge the JSON results of several runs into one table at ``out`` (JSON and ``.md``).

    Besides the table: how many accepted cells are over their limit, against how many
    would be if every cell's violation probability were exactly its allowed ``1 - g +
    inflation`` (the sum of each cell's chance of landing over its limit), and the
    smallest Holm-adjusted p-value of the cells' excess tests (statsmodels).
    """
    import json

    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    import tolstat

    cells, metas = [], []
    for p in paths:
        d = json.loads(p.read_text())
        metas.append({k: v for k, v in d.items() if k != "cells"})
        cells += [_cell(c) for c in d["cells"]]
    acc = [c for c in cells if c.accepted]
    over = [c for c in acc if not c.keeps_promise]
    expected = 0.0
    for c in acc:
        v = min(1.0, 1.0 - c.confidence + c.inflation)
        expected += float(stats.binom.sf(math.floor((c.limit + c.inflation) * c.accepted + 1e-9), c.accepted, v))
    pv = [c.p_excess for c in acc]
    holm = float(min(multipletests(pv, method="holm")[1])) if pv else float("nan")
    bad = [c for c in cells if not c.ok]
    secs = sum(float(m.get("seconds") or 0.0) for m in metas)
    md = (f"End-to-end promise of `tolstat.select` (tolstat {tolstat.__version__}), merged from {len(paths)} runs "
          f"({secs:.0f} s of computation): {len(cells)} cells, {len(acc)} with thresholds, {len(bad)} not ok. "
          f"Over their limit: {len(over)} cells, where {expected:.1f} are expected if every cell's violation "
          f"probability were exactly its allowed 1 - g + inflation; smallest Holm-adjusted p-value of the cells' "
          f"excess tests {holm:.2g}. Columns as in `promise_table.py`.\n\n" + ps.markdown_table(cells) + "\n")
    out = out if out.suffix == ".json" else out.with_suffix(".json")
    atomic_write_text(out, ps.results_json(cells, confidence=ps.CONFIDENCE, seconds=secs, merged=[str(p) for p in paths],
                                           runs=metas, over_limit=len(over), over_limit_expected=expected,
                                           holm_min_p=holm, tolstat_version=tolstat.__version__) + "\n")
    atomic_write_text(out.with_suffix(".md"), md)
    print(md)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
