"""Power table of the embedded corpus: what the default table, torch's defaults and ``1e-2`` catch.

Collects the calibration runs of ``tolstat evaluate --quick`` (every corpus op, float16 and
bfloat16, ``n_cal=400`` cases per (op, dtype), seed 0), calibrates the default table on them
exactly as ``tolstat evaluate`` does (the ``tolstat default`` method of
:func:`tolstat.assess.methods.tolstat_methods`: ``select(form="auto", cluster="case")`` per
(op, dtype) at ``fp_budget=0.01``, ``confidence=0.95``), and runs
:func:`tolstat.assess.power.power_report` on the first ``--n-refs`` calibration references
of every (op, dtype) (:func:`tolstat.assess.power.corpus_references`). Writes
``benchmarks/results/power.md`` (the table in ``docs/power.md``) and ``power.json``. Usage::

    python benchmarks/power_table.py [--n-refs 36] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    from threadpoolctl import threadpool_limits

    from tolstat._base.util import atomic_write_text
    from tolstat.assess.corpus_runs import calibration_dataset
    from tolstat.assess.evaluation import BY, EvalConfig
    from tolstat.assess.methods import tolstat_methods
    from tolstat.assess.power import corpus_references, power_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-refs", type=int, default=36, help="calibration references per (op, dtype)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    cfg = EvalConfig.preset("quick")
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):
        cal = calibration_dataset(cfg, progress=False)
        t_cal = time.perf_counter() - t0
        rule = tolstat_methods()[0]  # "tolstat default", as tolstat evaluate calibrates it
        table = rule.fit(cal, budget=cfg.fp_budget, confidence=cfg.confidence, by=BY).table
        refs = corpus_references(cfg.ops, cfg.dtypes, n=args.n_refs, seed=cfg.seed, quick=cfg.quick)
        t1 = time.perf_counter()
        rep = power_report(table, refs)
        t_pow = time.perf_counter() - t1
    secs = time.perf_counter() - t0
    print(rep.summary(), flush=True)
    settings = (f"Default table: `{rule.describe_at(cfg.fp_budget, cfg.confidence)}` per (op, dtype) on the "
                f"calibration runs of `tolstat evaluate --quick` ({cal.sizes['run']} runs: n_cal={cfg.n_cal} cases "
                f"per (op, dtype) through every correct variant, quick shapes, seed {cfg.seed}); power on the first "
                f"{args.n_refs} calibration references per (op, dtype). Produced by `python benchmarks/power_table.py "
                f"--n-refs {args.n_refs}` in {secs:.0f} s ({t_cal:.0f} s collecting, {t_pow:.0f} s power).")
    md = settings + "\n\n" + rep.to_markdown() + "\n\n" + rep.summary().replace("\n", "\n\n") + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "power.md", md)
    doc = {"settings": settings, "seconds": secs, "seconds_collect": t_cal, "seconds_power": t_pow,
           "n_refs": args.n_refs, "config": cfg.__dict__, **rep.to_dict()}
    atomic_write_text(args.out / "power.json", json.dumps(doc, indent=1, default=list))
    print(f"wrote {args.out / 'power.md'} and {args.out / 'power.json'} ({secs:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
