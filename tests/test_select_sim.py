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
from tolstat.models.estimators import order_statistic_min_n
from tolstat.calibration.selection import calibrate, select

G = 0.95
BUDGETS = (1e-2, 1e-3, 1e-4)
REPEATS = {50: 60, 500: 60, 5000: 40, 100000: 12}


def _run(n: int, a: float, fam: str) -> tuple[int, int, int, list[float], set[str], list[str]]:
    draw, sf, isf = FAMILIES[fam]
    rng = np.random.default_rng([n, int(round(-np.log10(a))), sorted(FAMILIES).index(fam)])
    cov = refused = 0
    tight: list[float] = []
    methods: set[str] = set()
    why: list[str] = []
    R = REPEATS[n]
    for i in range(R):
        x = draw(rng, n)
        try:
            c = calibrate(x, a, G, method="order_statistic" if n >= order_statistic_min_n(1 - a, G) else "evt",
                          seed=i)  # the model-based path below the minimum, explicitly
        except NotEnoughData as exc:
            refused += 1
            why.append(str(exc))
            continue
        methods.add(c.method)
        cov += bool(sf(c.threshold) <= a)
        tight.append(c.threshold / float(isf(a)))
    return R, refused, cov, tight, methods, why


@pytest.mark.slow
@pytest.mark.parametrize("n", sorted(REPEATS))
def test_coverage_of_thresholds(n):
    rows = []
    checked = set()
    for a in BUDGETS:
        nmin = order_statistic_min_n(1 - a, G)
        for fam in FAMILIES:
            R, refused, cov, tight, methods, why = _run(n, a, fam)
            acc = R - refused
            if n >= nmin:  # the order statistic never refuses, whatever the family
                assert acc == R and methods == {"order_statistic"}, (fam, n, a, why[:1])
            elif not fam.startswith("lattice"):  # continuous families: no vacuous pass
                assert acc >= 0.9 * R, (fam, n, a, refused)
            else:  # a lattice below nmin: refused for a stated reason, never the sample maximum
                assert all(f"needs n >= {nmin} runs" in w for w in why), why[:1]
            if acc:
                # not significantly below the promised confidence
                p = stats.binom.cdf(cov, acc, G)
                assert p >= 1e-3, (fam, n, a, cov, acc)
                checked.add(fam)
            rows.append(f"n={n:6d} a={a:6g} {fam:20s} accepted {acc:3d}/{R} coverage "
                        f"{(cov / acc) if acc else float('nan'):.3f} tightness median "
                        f"{np.median(tight) if tight else float('nan'):.3g} {sorted(methods)}")
    print("\n" + "\n".join(rows))
    # the lattice's coverage is checked at the sizes where some budget reaches the order statistic
    if n >= order_statistic_min_n(1 - max(BUDGETS), G):
        assert checked == set(FAMILIES), sorted(set(FAMILIES) - checked)


def test_lattice_refused_beyond_data_and_never_sample_max():
    """A lattice (ties) below the order-statistic n: refused with the runs needed, not the max."""
    x = np.random.default_rng(0).poisson(2.0, 100).astype(float)
    assert x.max() < 20  # the sample maximum exists and would be a (wrong) threshold
    with pytest.raises(ValueError, match=r"needs n >= 2995 runs .*have n = 100; the tail model was refused: "
                                         r"only \d+ distinct values above the tail threshold"):
        calibrate(x, 1e-3, 0.95, method="evt")


def test_select_thresholds_are_per_group_order_statistics():
    """select's threshold per group is the r-th smallest max error of that group's runs, r the
    smallest rank with binom.cdf(r - 1, n, 1 - a) >= g (computed here from scipy, not tolstat)."""
    import tolstat

    rng = np.random.default_rng(3)
    sizes = {"cpu": 400, "gpu": 700}
    # distinct references (runs with one reference would be one unit: the same inputs)
    pairs = {hw: [(np.float16([v]), np.array([j * 2.0**-40])) for j, v in
                  enumerate(np.abs(rng.standard_normal(n)) * (1 + 3 * i))]
             for i, (hw, n) in enumerate(sizes.items())}
    ds = tolstat.concat([tolstat.from_pairs(p, op="id", dtype="float16", hardware=hw) for hw, p in pairs.items()])
    t = select(ds, form=None, fp_budget=0.02)
    thr = {}
    for hw, n in sizes.items():
        x = np.sort(np.array([abs(float(a[0]) - float(e[0])) for a, e in pairs[hw]]))
        ranks = np.arange(1, n + 1)
        r = int(ranks[stats.binom.cdf(ranks - 1, n, 0.98) >= G][0])
        assert r < n  # an inner order statistic, not the maximum
        ent = t.entry("id", "float16", hw)
        thr[hw] = ent.statistics["max_abs"].threshold
        assert thr[hw] == x[r - 1], hw
        assert ent.certificate["rank"] == r and ent.certificate["n_scores"] == n
        assert f"the threshold is the {r}-th smallest of {n} scores" in ent.certificate["guarantee"]
    assert thr["cpu"] != thr["gpu"]
