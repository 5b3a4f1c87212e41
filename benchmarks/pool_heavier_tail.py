"""A heavier-tailed group among exchangeable ones: how often pooling breaks its budget.

Ten groups of ``U`` units and one statistic; nine draw ``|N(0, 1)|``, one draws ``|t_2|``
(Student's t with 2 degrees of freedom: a far heavier tail). Every group is too small for
its own order statistic at budget 1 % and confidence 0.95 (299 units) unless ``U >= 300``,
so each borrows from the pool when the pool test does not refuse it. The true false-positive
rate of each threshold is exact (closed-form survival functions), so a calibration
*violates* for a group when its rate exceeds the budget; the promise allows that in at most
5 % of calibrations.

Run: ``python benchmarks/pool_heavier_tail.py --units 30 100 --reps 200`` (writes
``benchmarks/results/pool_heavier_tail.md``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from tolstat.calibration.engine import CertifyOptions, certify

GROUPS, BUDGET = 10, 0.01
OUT = Path(__file__).resolve().parent / "results" / "pool_heavier_tail.md"


def one_cell(units: int, reps: int, pool_normalisers: str) -> dict:
    """Thresholds, refusals and violations of the heavy group and of the light ones."""
    rng = np.random.default_rng(1)
    heavy = {"thresholds": 0, "violations": 0}
    light = {"thresholds": 0, "violations": 0}
    labels = np.repeat([f"g{g}" for g in range(GROUPS)], units)
    for rep in range(reps):
        t = np.concatenate([np.abs(rng.standard_t(2, units))] +
                           [np.abs(rng.standard_normal(units)) for _ in range(GROUPS - 1)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = certify({"T": t}, labels, fp_budget=BUDGET, on_refusal="record",
                          options=CertifyOptions(pool_normalisers=pool_normalisers, seed=rep))
        for g in range(GROUPS):
            c = res.groups.get(f"g{g}")
            if c is None:
                continue
            x = c.threshold * c.normalisers.get("T", 1.0)
            fp = 1.0 - (2.0 * stats.t.cdf(x, 2) - 1.0 if g == 0 else stats.halfnorm.cdf(x))
            cell = heavy if g == 0 else light
            cell["thresholds"] += 1
            cell["violations"] += int(fp > BUDGET)
    return {"units": units, "reps": reps, "pool_normalisers": pool_normalisers, "heavy": heavy, "light": light}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, nargs="+", default=[30, 100])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--pool-normalisers", default="shared", choices=["shared", "own"])
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [one_cell(u, args.reps, args.pool_normalisers) for u in args.units]
    lines = [f"# A |t_2| group among nine |N(0,1)| groups (pool_normalisers={args.pool_normalisers!r})", "",
             f"`python benchmarks/pool_heavier_tail.py --units {' '.join(map(str, args.units))} --reps {args.reps}`"
             f" ({time.perf_counter() - t0:.0f} s). Budget {BUDGET:g}, confidence 0.95; a violation is a "
             "calibration whose exact false-positive rate exceeds the budget (allowed: 5 % of calibrations).", "",
             "| units/group | calibrations | heavy: threshold | heavy: violations (of all calibrations) | "
             "heavy: violations given a threshold | light groups: violations / thresholds |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        h, lg, n = r["heavy"], r["light"], r["reps"]
        cond = h["violations"] / h["thresholds"] if h["thresholds"] else float("nan")
        lines.append(f"| {r['units']} | {n} | {h['thresholds']} | {h['violations']} ({h['violations'] / n:.1%}) | "
                     f"{cond:.1%} | {lg['violations']} / {lg['thresholds']} "
                     f"({lg['violations'] / max(lg['thresholds'], 1):.1%}) |")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
