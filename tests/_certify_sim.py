"""Coverage simulation of :func:`tolstat.calibration.engine.certify` on run statistics with KNOWN truth.

Each family draws per-run statistics from a distribution whose survival function is known
in closed form, so the TRUE false-positive rate of a threshold ``t`` on the combined score
``S = max_j T_j / q_j`` is exact: with independent statistics,
``FP(t) = 1 - prod_j (1 - sf_j(t * q_j))`` for a new single run (of any variant, for the
clustered families, whose runs share the same marginal). A calibration *violates* when
``FP(t) > fp_budget``; the promise is that this happens with probability
``<= 1 - confidence``.

Used by ``tests/test_certify_sim.py`` and ``benchmarks/coverage_table.py``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tolstat.calibration.engine import CertifyOptions, certify
from tolstat.calibration.units import fit_size
from tolstat.models.estimators.orderstat import order_statistic_min_n

CONFIDENCE = 0.95


def _halfnorm(r, n):
    return np.abs(r.standard_normal(n))


def _rare(eps: float, k: float = 10.0):
    def draw(r, n):
        x = _halfnorm(r, n)
        big = r.random(n) < eps
        return np.where(big, k * x, x)

    return draw, (lambda x: (1 - eps) * stats.halfnorm.sf(x) + eps * stats.halfnorm.sf(x / k))


_SCALES = np.array([0.5, 1.0, 2.0])


def _scalemix_draw(r, n):
    return _SCALES[r.integers(0, 3, n)] * _halfnorm(r, n)


def _scalemix_sf(x):
    return np.mean([stats.halfnorm.sf(np.asarray(x) / s) for s in _SCALES], axis=0)


def _lattice_draw(r, n):
    return r.poisson(2.0, n).astype(float)


def _lattice_sf(x):
    return stats.poisson.sf(np.floor(x), 2.0)


def _clustered(k: int, rho: float = 0.9):
    """Cases of k correlated variants: T = |rho Z_case + sqrt(1-rho^2) W_run|, marginal |N(0,1)|."""

    def draw(r, n):
        nc = math.ceil(n / k)
        z = np.repeat(r.standard_normal(nc), k)[:n]
        return np.abs(rho * z + math.sqrt(1 - rho * rho) * r.standard_normal(n))

    return draw, stats.halfnorm.sf


#: name -> (draw(rng, n) -> runs, sf(x) = P(T > x) of one run, variants per case or 0)
FAMILIES = {
    "light (half-normal)": (_halfnorm, stats.halfnorm.sf, 0),
    "heavy (|t3|)": (lambda r, n: np.abs(r.standard_t(3, n)), lambda x: 2 * stats.t.sf(x, 3), 0),
    "lattice (Poisson 2)": (_lattice_draw, _lattice_sf, 0),
    "scale mixture (0.5/1/2)": (_scalemix_draw, _scalemix_sf, 0),
    "rare 0.5% at 10x": (*_rare(0.005), 0),
    "rare 2% at 10x": (*_rare(0.02), 0),
    "clustered 3 variants": (*_clustered(3), 3),
    "clustered 4 variants": (*_clustered(4), 4),
}

#: second statistic of the two-statistic score (independent of the first)
SECOND = (lambda r, n: r.exponential(size=n), stats.expon.sf)


@dataclass
class Cell:
    family: str
    n: int            # runs per group
    groups: int       # groups calibrated together (> 1: pooling)
    budget: float
    n_stats: int
    repeats: int
    refused: int
    violations: int
    expected: bool    # a threshold should exist (enough units)
    methods: tuple[str, ...]
    tightness: float  # median threshold FP / budget (1 = as tight as allowed)

    @property
    def accepted(self) -> int:
        return self.repeats - self.refused

    @property
    def rate(self) -> float:
        return self.violations / self.accepted if self.accepted else math.nan

    @property
    def p_excess(self) -> float:
        """One-sided binomial p-value of "the violation probability exceeds 1 - confidence"."""
        if not self.accepted:
            return math.nan
        return float(stats.binom.sf(self.violations - 1, self.accepted, 1 - CONFIDENCE))

    @property
    def limit(self) -> float:
        """``1 - confidence`` plus two Monte-Carlo standard errors."""
        a = 1 - CONFIDENCE
        return a + 2 * math.sqrt(a * (1 - a) / self.accepted) if self.accepted else math.nan


def expected_threshold(family: str, n: int, groups: int, budget: float, n_stats: int) -> bool:
    """Whether the units suffice for a threshold (own order statistic, or the whole pool)."""
    k = FAMILIES[family][2]
    units = math.ceil(n / k) if k else n
    nmin = order_statistic_min_n(1 - budget, CONFIDENCE)
    own = units - fit_size(units, n_stats, nmin) >= nmin
    if own or groups == 1:
        return own
    return groups * units - (0 if n_stats == 1 else 1) >= nmin


def run_cell(family: str, n: int, budget: float, *, n_stats: int = 1, groups: int = 1,
             repeats: int = 200, seed: int = 0, scale0: float = 1.0) -> Cell:
    """Calibrate ``repeats`` times on fresh data; count refusals and violations of group 0.

    ``scale0`` multiplies group 0's first statistic (a non-exchangeable group when != 1);
    its true FP is computed with that scale.
    """
    draw, sf, k = FAMILIES[family]
    fam_i = sorted(FAMILIES).index(family)
    rng = np.random.default_rng([seed, fam_i, n, groups, n_stats, int(round(-math.log10(budget)))])
    labels = np.repeat(np.arange(groups), n)
    cluster = None
    if k:
        cluster = np.concatenate([g * 10**7 + np.arange(n) // k for g in range(groups)])
    refused = viol = 0
    methods: set[str] = set()
    tight = []
    for i in range(repeats):
        st = {"T1": draw(rng, n * groups)}
        st["T1"][:n] *= scale0
        if n_stats == 2:
            st["T2"] = SECOND[0](rng, n * groups)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = certify(st, labels, fp_budget=budget, confidence=CONFIDENCE, cluster=cluster,
                          on_refusal="record", options=CertifyOptions(seed=i))
        if "0" not in res.groups:
            refused += 1
            continue
        c = res.groups["0"]
        methods.add(c.method)
        t = c.threshold
        pass_prob = 1.0 - float(sf(t * c.normalisers["T1"] / scale0))
        if n_stats == 2:
            pass_prob *= 1.0 - float(SECOND[1](t * c.normalisers["T2"]))
        fp = 1.0 - pass_prob
        viol += fp > budget
        tight.append(fp / budget)
    return Cell(family, n, groups, budget, n_stats, repeats, refused, int(viol),
                expected_threshold(family, n, groups, budget, n_stats), tuple(sorted(methods)),
                float(np.median(tight)) if tight else math.nan)


def grid(full: bool = True) -> list[tuple[str, int, int, float, int, int]]:
    """Cells ``(family, runs per group, groups, budget, statistics, repeats)``.

    ``full=False`` is the default test run's subset. Single groups at n = 300, 1000, 3000
    (budget 1e-2) and n = 3000 (1e-3); 10 exchangeable groups of n = 30 and 100 runs
    (pooling, 1e-2) and of n = 300 (1e-3). Cells where the units cannot suffice are kept:
    they must be refused.
    """
    cells = []
    fams = list(FAMILIES)
    if not full:
        for f in fams:
            k = FAMILIES[f][2]
            cells.append((f, 300 * k if k else 300, 1, 1e-2, 1, 200))
            cells.append((f, 3000, 1, 1e-2, 2, 200))
        for f in ("light (half-normal)", "rare 0.5% at 10x", "lattice (Poisson 2)"):
            cells.append((f, 3000, 1, 1e-3, 1, 200))
        for f in ("light (half-normal)", "rare 2% at 10x"):
            cells.append((f, 30, 10, 1e-2, 1, 100))
        return cells
    for f in fams:
        for j in (1, 2):
            for n in (30, 300, 1000, 3000):
                cells.append((f, n, 1, 1e-2, j, 1000 if n > 30 else 50))
            cells.append((f, 3000, 1, 1e-3, j, 1000))
            cells.append((f, 30, 10, 1e-2, j, 60))
            cells.append((f, 100, 10, 1e-2, j, 60))
            cells.append((f, 300, 10, 1e-3, j, 30))
    return cells


def run_grid(cells) -> list[Cell]:
    return [run_cell(f, n, b, n_stats=j, groups=g, repeats=r) for f, n, g, b, j, r in cells]


def check_cell(c: Cell) -> list[str]:
    """Problems of one cell: a violation rate above the limit, or refusals where a threshold should exist."""
    out = []
    # An exact method's violation probability sits just below 1 - confidence, so the 2-s.e.
    # line alone is crossed by chance in about 2% of cells; a cell fails when it is crossed
    # AND the excess is significant (one-sided binomial p < 1e-3).
    if c.accepted and c.rate > c.limit and c.p_excess < 1e-3:
        out.append(f"{c}: violation rate {c.rate:.3f} > {c.limit:.3f}, binomial p = {c.p_excess:.2g}")
    if c.expected:
        allowed = 0 if c.groups == 1 else max(2, int(0.05 * c.repeats))
        if c.refused > allowed:
            out.append(f"{c}: {c.refused} refusals where a threshold should exist (allowed {allowed})")
    elif c.accepted:
        out.append(f"{c}: thresholds although the units cannot suffice")
    return out


def table(cells: list[Cell]) -> str:
    """Markdown coverage table."""
    rows = ["| family | runs/group | groups | stats | budget | repeats | refused | violations | rate | limit | "
            "p(excess) | median FP/budget | method |", "|" + "---|" * 13]
    for c in cells:
        rate = "-" if not c.accepted else f"{c.rate:.3f}"
        lim = "-" if not c.accepted else f"{c.limit:.3f}" + ("" if c.rate <= c.limit else " **over**")
        pex = "-" if not c.accepted else f"{c.p_excess:.2g}"
        tight = "-" if not c.accepted else f"{c.tightness:.2f}"
        rows.append(f"| {c.family} | {c.n} | {c.groups} | {c.n_stats} | {c.budget:g} | {c.repeats} | {c.refused} | "
                    f"{c.violations} | {rate} | {lim} | {pex} | {tight} | {', '.join(c.methods) or 'refused'} |")
    return "\n".join(rows)
