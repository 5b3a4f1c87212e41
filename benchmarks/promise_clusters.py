"""Correlated variants that share their inputs, not declared: the promise end to end.

``k`` correct variants per input (k = 2, 3, 4) with noise correlation 0.5 or 0.9, no
cluster label: the runs of one input share its float64 reference and count as one unit.
For each family, path and form, ``R`` calibrations of ``inputs x k`` runs through
``tolstat.from_pairs`` -> ``tolstat.select`` -> ``tolstat.check`` on a new set of fresh
correct runs per calibration (``tests/_promise_sim.py``).

Usage::

    python benchmarks/promise_clusters.py                 # 300 inputs, every form, 12 calibrations
    python benchmarks/promise_clusters.py --inputs 600 --corr 0.9 --k 2 4 --paths plain
    python benchmarks/promise_clusters.py --reps 80 --corr 0.9 --forms default none operator

Prints each cell and writes a Markdown table (``--out``, atomically).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import _promise_sim as ps  # noqa: E402

from tolstat._base.util import atomic_write_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, nargs="+", default=[2, 3, 4], help="variants per input")
    p.add_argument("--corr", nargs="+", default=["0.5", "0.9"], help="noise correlation between variants")
    p.add_argument("--paths", nargs="+", default=["plain", "operator"], choices=["plain", "operator"])
    p.add_argument("--forms", nargs="+", default=None, help="forms to keep (default: every form of each path)")
    p.add_argument("--inputs", type=int, default=300, help="distinct inputs per calibration")
    p.add_argument("--reps", type=int, default=12, help="calibrations per cell")
    p.add_argument("--out", type=Path, default=HERE / "results" / "promise_clusters.md")
    args = p.parse_args(argv)
    t0, out = time.time(), []
    for k in args.k:
        for c in args.corr:
            for path in args.paths:
                forms = tuple(f for f in ps.FORMS[path] if args.forms is None or f in args.forms)
                if not forms:
                    continue
                b = ps.Batch(f"clustered_k{k}_c{c}", path, args.inputs * k, (1e-2,), forms, reps=args.reps,
                             fresh_factor=10.0, fresh_per_calibration=True)
                for r in ps.run_batch(b):
                    out.append(r)
                    print(r.summary(), flush=True)
    atomic_write_text(args.out, ps.markdown_table(out) + "\n")
    bad = [r for r in out if not r.ok]
    print(f"wrote {args.out}: {len(out)} cells, {len(bad)} not ok, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
