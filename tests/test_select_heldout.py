"""Held-out calibration: collect a small fp16 reduction kernel, calibrate on half, check the rest."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import tolstat
from tolstat.checks.checking import check
from tolstat.models import ScaleOptions
from tolstat.calibration.options import SelectOptions
from tolstat.calibration.selection import select

SCALES = (1.0, 10.0, 100.0)
K_CAL = (16, 64, 256)
K_UNSEEN = (24, 100, 200)
ROWS = 32
#: the normalised form's covariates: a power law in K, additive in the reference's RMS
NORMALISED = SelectOptions(scale=ScaleOptions(power=("K",), linear=("ref_rms",)))


def _kernel(x):
    # sequential fp16 accumulation: the error grows with K and with the magnitude
    return np.cumsum(x.astype(np.float16), axis=-1, dtype=np.float16)[:, -1]


def _reference(x):
    return x.astype(np.float16).astype(np.float64).sum(axis=-1)


def _maker(ks):
    def make(rng):
        k = int(rng.choice(ks))
        s = float(rng.choice(SCALES))
        return tolstat.Inputs(args=(s * rng.standard_normal((ROWS, k)),), covariates={"K": k, "scale": s},
                              labels={"part": "x"})
    return make


@pytest.fixture(scope="module")
def data():
    cal = tolstat.collect(_kernel, _reference, _maker(K_CAL), op="rowsum", dtype="float16", runs=3000,
                          hardware="cpu", seed=1, options=tolstat.CollectOptions(progress=False))
    unseen = tolstat.collect(_kernel, _reference, _maker(K_UNSEEN), op="rowsum", dtype="float16", runs=1500,
                             hardware="cpu", seed=2, options=tolstat.CollectOptions(progress=False))
    idx = np.arange(cal.sizes["run"])
    return cal.isel(run=idx[idx % 2 == 0]), cal.isel(run=idx[idx % 2 == 1]), unseen


BUDGET = 0.05


def _not_above(fails: int, n: int, budget: float, level: float = 1e-3) -> bool:
    """False if the realised FP count is significantly above the budget (one-sided binomial)."""
    return stats.binom.sf(fails - 1, n, budget) >= level


def _fails(table, ds, cov_names=("K",)):
    """Re-run the check on the held-out runs from their stored element samples (exact by the Pareto front)."""
    from tolstat.models.scale import run_scores

    ent = table.entry("rowsum", "float16", "cpu")
    name = ent.max_statistic
    x = (run_scores(ds, ent.scale, "max_abs") if ent.scale is not None else run_scores(ds, None, name)).scores
    return x > ent.statistics[name].threshold


@pytest.mark.parametrize("form", [None, "allclose", "size_aware", "normalised"])
def test_heldout_fp_rate_within_budget(data, form):
    train, test, unseen = data
    t = select(train, fp_budget=BUDGET, confidence=0.95, form=form, options=NORMALISED)
    f = _fails(t, test)
    assert _not_above(int(f.sum()), f.size, BUDGET), (form, f.mean())


@pytest.mark.parametrize("form", ["size_aware", "normalised"])
def test_conditional_budget_across_magnitudes_and_sizes(data, form):
    train, test, unseen = data
    t = select(train, fp_budget=BUDGET, form=form, options=NORMALISED)
    f = _fails(t, test)
    for s in SCALES:
        m = test["scale"].values == s
        assert _not_above(int(f[m].sum()), int(m.sum()), BUDGET), ("scale", s, f[m].mean())
    for k in K_CAL:
        m = test["K"].values == k
        assert _not_above(int(f[m].sum()), int(m.sum()), BUDGET), ("K", k, f[m].mean())
    fu = _fails(t, unseen)
    for k in K_UNSEEN:
        m = unseen["K"].values == k
        assert _not_above(int(fu[m].sum()), int(m.sum()), BUDGET), ("unseen K", k, fu[m].mean())


def test_size_aware_keeps_budget_on_unseen_sizes(data):
    train, test, unseen = data
    t = select(train, fp_budget=BUDGET, form="size_aware")
    fu = _fails(t, unseen)
    assert _not_above(int(fu.sum()), fu.size, BUDGET), fu.mean()
    beta = t.entry("rowsum", "float16").scale.power["K"][0]
    assert 0.2 < beta < 1.5  # sequential fp16 accumulation: error grows with K


def test_normalised_tighter_than_max_abs_on_small_magnitudes(data):
    train, test, _ = data
    t_abs = select(train, form=None, fp_budget=BUDGET)
    t_norm = select(train, fp_budget=BUDGET, form="normalised", options=NORMALISED)
    atol_abs = t_abs.entry("rowsum", "float16").statistics["max_abs"].threshold
    ent = t_norm.entry("rowsum", "float16")
    c = ent.statistics["max_score"].threshold
    small = test.isel(run=np.flatnonzero((test["scale"].values == 1.0) & (test["K"].values == 16)))
    # largest |d| the normalised check allows anywhere in each small-magnitude run
    cov = {"K": small["K"].values, "ref_rms": small["ref_rms"].values}
    allowed = c * ent.scale.scale(small["sample_ref"].values, cov)
    allowed = np.nanmax(np.where(np.isnan(small["sample_abs"].values), np.nan, allowed), axis=1)
    ratio = atol_abs / np.median(allowed)
    assert ratio > 20, ratio


def test_check_agrees_with_calibration_scores(data):
    """check() on a fresh run computes the same score as the calibration path."""
    train, _, _ = data
    t = select(train, fp_budget=BUDGET, form="normalised", options=NORMALISED)
    rng = np.random.default_rng(7)
    x = 10.0 * rng.standard_normal((ROWS, 64))
    r = check(_kernel(x), _reference(x), op="rowsum", dtype="float16", table=t, covariates={"K": 64})
    one = tolstat.from_pairs([(_kernel(x), _reference(x), None, {"K": 64, "scale": 10.0})], op="rowsum",
                             dtype="float16", hardware="cpu", options=tolstat.CollectOptions(labels={"part": "x"}))
    from tolstat.models.scale import run_scores

    s = run_scores(one, t.entry("rowsum", "float16").scale).scores
    assert r.statistics["max_score"] == pytest.approx(float(s[0]), rel=1e-12)
