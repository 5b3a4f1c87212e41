"""Simulation: select's thresholds keep the false-positive budget at the promised confidence.

Run-level statistics are drawn directly from known distributions (``_sim_families``); the
true exceedance probability of each threshold is computed from the distribution. For each
(family, budget a, runs n), the fraction of repeats with ``P(X > threshold) <= a`` must not
be significantly below the confidence g (one-sided binomial test at level 1e-3); refusals
(NotEnoughData: too few runs, inadequate tail) are allowed and counted. Tightness
(threshold / true (1-a)-quantile) is printed (``pytest -s``).
"""

from __future__ import annotations

import numpy as np
import pytest
from _sim_families import FAMILIES
from scipy import stats

from tolstat import NotEnoughData
from tolstat.estimators.orderstat import order_statistic_min_n
from tolstat.selection import calibrate, select

G = 0.95
BUDGETS = (1e-2, 1e-3, 1e-4)
REPEATS = {50: 60, 500: 60, 5000: 40, 100000: 12}


def _run(n: int, a: float, fam: str) -> tuple[int, int, int, list[float], set[str]]:
    draw, sf, isf = FAMILIES[fam]
    rng = np.random.default_rng([n, int(round(-np.log10(a))), sorted(FAMILIES).index(fam)])
    cov = refused = 0
    tight: list[float] = []
    methods: set[str] = set()
    R = REPEATS[n]
    for i in range(R):
        x = draw(rng, n)
        try:
            c = calibrate(x, a, G, method="order_statistic" if n >= order_statistic_min_n(1 - a, G) else "evt",
                          seed=i)  # the model-based path, explicitly
        except NotEnoughData:
            refused += 1
            continue
        methods.add(c.method)
        cov += bool(sf(c.threshold) <= a)
        tight.append(c.threshold / float(isf(a)))
    return R, refused, cov, tight, methods


@pytest.mark.slow
@pytest.mark.parametrize("n", sorted(REPEATS))
def test_coverage_of_thresholds(n):
    rows = []
    for a in BUDGETS:
        for fam in FAMILIES:
            R, refused, cov, tight, methods = _run(n, a, fam)
            acc = R - refused
            if not fam.startswith("lattice"):  # continuous families: no vacuous pass
                assert acc >= 0.9 * R, (fam, n, a, refused)
            if acc:
                # not significantly below the promised confidence
                p = stats.binom.cdf(cov, acc, G)
                assert p >= 1e-3, (fam, n, a, cov, acc)
            rows.append(f"n={n:6d} a={a:6g} {fam:20s} accepted {acc:3d}/{R} coverage "
                        f"{(cov / acc) if acc else float('nan'):.3f} tightness median "
                        f"{np.median(tight) if tight else float('nan'):.3g} {sorted(methods)}")
    print("\n" + "\n".join(rows))


def test_lattice_refused_beyond_data_and_never_sample_max():
    """A lattice (ties) below the order-statistic n: refused with the runs needed, not the max."""
    x = np.random.default_rng(0).poisson(2.0, 100).astype(float)
    with pytest.raises(ValueError, match=r"need|needs n >= 2995"):
        calibrate(x, 1e-3, 0.95)


def test_select_uses_calibrate_per_group():
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal(400))
    import tolstat

    ds = tolstat.from_pairs([(np.float16([v]), np.array([0.0])) for v in x], op="id", dtype="float16",
                            hardware="cpu")
    t = select(ds, form=None, fp_budget=0.01)
    c = calibrate(ds["max_abs"].values, 0.01, 0.95)
    assert t.entry("id", "float16").statistics["max_abs"].threshold == c.threshold
