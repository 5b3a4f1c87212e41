"""Coverage of the DEFAULT ``tolstat.select`` call (form "auto" -> the operator combined score).

Error datasets are assembled with operator statistics of known distribution (the families
of ``tests/_certify_sim.py``: light and heavy tails, lattice, rare large-error mixtures,
clustered variants declared with ``cluster=``), calibrated by ``select(ds, fp_budget=...)``
with every other argument at its default, and the TRUE false-positive rate of the
resulting threshold is computed exactly from the survival functions. The rate of
calibrations whose true FP exceeds the budget must stay within ``1 - confidence`` plus
two Monte-Carlo standard errors. The default run checks a subset; ``slow`` a wider grid.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tolstat

sys.path.insert(0, str(Path(__file__).parent))
from _certify_sim import CONFIDENCE, FAMILIES, SECOND  # noqa: E402

OP_STATS = None  # filled lazily: the op_statistic variables of the template


@functools.lru_cache(maxsize=8)
def _template(n: int, groups: int, k: int):
    """An error dataset of ``n * groups`` runs with operator statistics and a ``case`` label."""
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(n * groups):
        e = rng.standard_normal(8)
        a = (e * (1 + 1e-3)).astype(np.float16)
        case = f"{i // n}-{(i % n) // k if k else i % n}"
        pairs.append((a, e, np.abs(e), {"case": case}))
    ds = tolstat.from_pairs(pairs, op="sim", dtype="float16", options=tolstat.CollectOptions(progress=False))
    # groups: one op on several machines (hardware labels g0, g1, ...)
    hw = np.repeat([f"g{j}" for j in range(groups)], n)
    return ds.assign(hardware=("run", hw.astype(str)), max_ulp=("run", np.ones(n * groups)))


def _dataset(n: int, groups: int, k: int, t1: np.ndarray, t2: np.ndarray | None):
    ds = _template(n, groups, k).copy()
    nan = np.full(t1.size, np.nan)
    upd = {v: ("run", nan) for v in ds.data_vars if ds[v].attrs.get("role") == "op_statistic"}
    upd["op_max"] = ("run", t1)
    if t2 is not None:
        upd["op_rms"] = ("run", t2)
    out = ds.assign(upd)
    for v in upd:
        out[v].attrs = ds[v].attrs
    return out


def run_default_cell(family: str, n: int, budget: float, *, n_stats: int = 1, groups: int = 1,
                     repeats: int = 100, seed: int = 0) -> tuple[int, int, int, set[str]]:
    """(accepted, violations, refused, methods) of group g0 over ``repeats`` default calibrations."""
    draw, sf, k = FAMILIES[family]
    rng = np.random.default_rng([seed, sorted(FAMILIES).index(family), n, groups, n_stats])
    acc = viol = refused = 0
    methods: set[str] = set()
    for i in range(repeats):
        t1 = draw(rng, n * groups)
        t2 = SECOND[0](rng, n * groups) if n_stats == 2 else None
        ds = _dataset(n, groups, k, t1, t2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = tolstat.select(ds, fp_budget=budget, on_error="skip", options=tolstat.SelectOptions(seed=i),
                               **({"cluster": "case"} if k else {}))
        cert = t.entry("sim", "float16", "g0").certificate if not math.isnan(
            float(t.data["threshold"].values[0, 0])) else None
        if cert is None:
            refused += 1
            continue
        thr = t.entry("sim", "float16", "g0").statistics["op_score"].threshold
        q = cert["normalisers"]
        methods.add(cert["method"])
        pass_prob = 1.0 - float(sf(thr * q["op_max"]))
        if n_stats == 2:
            pass_prob *= 1.0 - float(SECOND[1](thr * q["op_rms"]))
        viol += (1.0 - pass_prob) > budget
        acc += 1
    return acc, viol, refused, methods


def _limit(acc: int) -> float:
    a = 1 - CONFIDENCE
    return a + 2 * math.sqrt(a * (1 - a) / acc)


CELLS = [
    ("light (half-normal)", 300, 1e-2, 2, 1),
    ("heavy (|t3|)", 300, 1e-2, 1, 1),
    ("lattice (Poisson 2)", 300, 1e-2, 1, 1),
    ("rare 2% at 10x", 300, 1e-2, 2, 1),
    ("clustered 3 variants", 900, 1e-2, 1, 1),
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c[0]}-n{c[1]}-j{c[3]}")
def test_default_select_coverage(cell):
    f, n, b, j, g = cell
    acc, viol, refused, methods = run_default_cell(f, n, b, n_stats=j, groups=g, repeats=60)
    assert acc >= 55, (acc, refused)
    assert viol / acc <= _limit(acc), (f, viol, acc)
    assert methods <= {"order_statistic", "exact"}, methods


@pytest.mark.slow
def test_default_select_ten_groups_of_thirty_exchangeable():
    """10 groups x 30 runs, exchangeable: every group gets a (pooled) threshold, the promise holds."""
    acc, viol, refused, methods = run_default_cell("scale mixture (0.5/1/2)", 30, 1e-2, groups=10, repeats=40)
    assert refused <= 2, refused
    assert methods == {"pooled_order_statistic"}
    assert viol / acc <= _limit(acc), (viol, acc)
    ds = _dataset(30, 10, 0, np.abs(np.random.default_rng(1).standard_normal(300)), None)
    t = tolstat.select(ds, fp_budget=1e-2)
    assert all(math.isfinite(float(x)) for x in t.data["threshold"].values[:, 0])


@pytest.mark.slow
@pytest.mark.parametrize("cell", [
    ("rare 0.5% at 10x", 300, 1e-2, 1, 1),
    ("scale mixture (0.5/1/2)", 1000, 1e-2, 2, 1),
    ("clustered 4 variants", 1200, 1e-2, 2, 1),
    ("rare 2% at 10x", 3000, 1e-3, 1, 1),
    ("heavy (|t3|)", 100, 1e-2, 2, 10),
], ids=lambda c: f"{c[0]}-n{c[1]}-a{c[2]:g}-j{c[3]}-g{c[4]}")
def test_default_select_coverage_wider(cell):
    f, n, b, j, g = cell
    acc, viol, refused, methods = run_default_cell(f, n, b, n_stats=j, groups=g, repeats=60)
    assert acc >= 50, (acc, refused)
    assert viol / acc <= _limit(acc), (f, viol, acc)


@pytest.mark.slow
def test_default_select_pools_different_operators_in_their_own_units():
    """10 operators whose statistics differ in scale (0.5x to 5x), 100 runs each: too few for
    their own order statistic (299), so they pool in units of their own normalisers; group 0
    mostly gets a threshold (the exchangeability test refuses it at times: normalisers from
    33 units are noisy) and its promise holds (truth known)."""
    draw, sf, _ = FAMILIES["light (half-normal)"]
    scales = np.linspace(0.5, 5.0, 10)
    ops = np.repeat([f"op{j}" for j in range(10)], 100).astype(str)
    rng = np.random.default_rng(11)
    acc = viol = refused = 0
    for i in range(40):
        t1 = draw(rng, 1000) * np.repeat(scales, 100)
        ds = _dataset(100, 10, 0, t1, None).assign(op=("run", ops), hardware=("run", np.full(1000, "hw")))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = tolstat.select(ds, fp_budget=1e-2, on_error="skip", options=tolstat.SelectOptions(seed=i))
        if not np.isfinite(t.data["threshold"].values[0, 0]):
            refused += 1
            continue
        e = t.entry("op0", "float16")
        assert e.certificate["method"] == "pooled_order_statistic" and "own normalisers" in e.certificate["reason"]
        fp = float(sf(e.statistics["op_score"].threshold * e.certificate["normalisers"]["op_max"] / scales[0]))
        viol += fp > 1e-2
        acc += 1
    assert refused <= 10, refused
    assert viol / acc <= _limit(acc), (viol, acc)
