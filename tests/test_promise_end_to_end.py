"""End to end: ``tolstat.select``'s tables keep their false-positive budget on fresh correct runs.

Correct kernels with a known error law (``tests/_promise_sim.py``) produce output pairs;
``tolstat.from_pairs`` -> ``tolstat.select`` -> ``tolstat.check`` on fresh runs of the
same kernel, only through the public API. The promise: with probability ``>= g`` over
calibrations the fresh-run false-positive (FP) rate is ``<= a``. Over R calibrations the
realised violation rate (share of non-refused calibrations whose FP estimated on M fresh
runs exceeds ``a``) must be ``<= 1 - g + 2 s.e.`` (``s.e. = sqrt(g (1 - g) / R)``) plus the
expected inflation of estimating FP from M runs (reported per cell; about 0.006 for the
fast cells, ``M = 1000`` at ``a = 1e-2``). Each fast cell checks its calibrations on one
shared fresh set (cheap; its own sampling error is common to all calibrations of the cell,
so a fast verdict is less certain than its s.e. says: ``_promise_sim`` docstring).

The fast tests run a few small cells (about 75 s on 2 cores); the whole grid
(``benchmarks/promise_table.py`` prints its table) is marked ``slow``: one test per batch
(family, path, n), ``TOLSTAT_PROMISE_REPS`` calibrations per cell (default 12: it catches
gross breaks), fresh runs decided per pair unless ``TOLSTAT_PROMISE_CHECK_RUNS=1``. A grid
cell fails when its violation rate is over the line *and* significantly so (binomial
p < 1e-3, ``CellResult.ok``), when it is not refused although its independent units
cannot support the budget, or refused although they can (``_promise_sim.expected_outcome``).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from scipy import stats

import _promise_sim as ps
from _promise_sim import CellResult


@functools.lru_cache(maxsize=None)
def _cells(key: str) -> dict[str, CellResult]:
    """The cells of one fast batch, run once per session, by form."""
    return {c.form: c for c in ps.run_batch(ps.fast_batches()[key])}


def _assert_keeps_promise(c: CellResult) -> None:
    assert c.errors == 0, c.summary()
    if not c.accepted:
        pytest.fail(f"every calibration was refused, the promise cannot be checked: {c.summary()}")
    assert c.violation_rate <= c.limit + c.inflation, c.summary()


# --------------------------------------------------------------------------- the promise, fast cells
@pytest.mark.slow
def test_default_select_keeps_budget_on_fresh_runs_light_tails():
    """fp16 matmul (fp32 accumulation), 300 runs, 1%/95%, the default select call."""
    _assert_keeps_promise(_cells("light_plain_300")["default"])


@pytest.mark.slow
def test_single_plain_group_of_300_runs_is_not_refused():
    """300 independent runs suffice for 1% at 95% (ln(0.05)/ln(0.99) = 298.1): no refusal."""
    c = _cells("light_plain_300")["default"]
    assert c.errors == 0, c.summary()
    assert c.refused == 0, c.summary()


@pytest.mark.slow
def test_exact_duplicate_runs_do_not_break_the_budget():
    """150 cases x 3 identical copies: the promise holds (copies are not new evidence)."""
    c = _cells("duplicates_450")["default"]
    assert c.errors == 0, c.summary()
    assert not c.accepted or c.violation_rate <= c.limit + c.inflation, c.summary()


@pytest.mark.slow
def test_three_copies_of_150_runs_are_refused_at_1pct():
    """150 distinct runs are fewer than the 299 the order statistic needs: refused, copies or not."""
    c = _cells("duplicates_450")["default"]
    assert c.errors == 0, c.summary()
    assert c.accepted == 0, c.summary()


@pytest.mark.slow
def test_default_select_keeps_budget_with_undeclared_clustered_variants():
    """300 inputs x 3 correct variants with noise correlation 0.9, no cluster label declared."""
    c = _cells("clusters_undeclared_900")["default"]
    assert c.errors == 0, c.summary()
    assert not c.accepted or c.violation_rate <= c.limit + c.inflation, c.summary()


@pytest.mark.parametrize("form", ["default", "operator"])
@pytest.mark.slow
def test_operator_path_keeps_budget_on_fresh_runs(form):
    """300 runs with |A| @ |B| magnitudes and K; checks pass CheckOptions(magnitude=) and covariates={'K': k}."""
    _assert_keeps_promise(_cells("light_operator_300")[form])


@pytest.mark.slow
@pytest.mark.parametrize("form", ["default", "operator"])
def test_single_operator_group_of_300_runs_is_not_refused(form):
    c = _cells("light_operator_300")[form]
    assert c.errors == 0, c.summary()
    assert c.refused == 0, c.summary()


@pytest.mark.parametrize("path", ["plain", "operator"])
@pytest.mark.slow
def test_ten_exchangeable_groups_of_30_runs_get_thresholds(path):
    """10 ops of one law x 30 runs = 300 exchangeable runs: pooled, every group gets a threshold."""
    c = _cells(f"pooled_{path}_10x30")["default"]
    assert c.errors == 0, c.summary()
    assert c.refused == 0, c.summary()


@pytest.mark.parametrize("path", ["plain", pytest.param("operator", marks=pytest.mark.slow)])
def test_pooled_thresholds_keep_budget_on_fresh_runs(path):
    c = _cells(f"pooled_{path}_10x30")["default"]
    _assert_keeps_promise(c)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["plain", "operator"])
def test_light_groups_borrow_a_rejected_noisier_groups_scores_and_keep_budget(path):
    """One op with twice the light law's error among nine of the light law, 30 runs each. When
    the pool test rejects the noisier op (refused), the light ops, 270 units alone where 299
    are needed, borrow its higher scores unless that would set their threshold above
    LEND_MAX_RAISE times their own largest score (then they are refused): in some of the 20
    calibrations a light op gets a threshold while the noisier op is refused, and over all
    calibrations the light op's thresholds keep the budget on fresh runs."""
    c = _cells(f"pooled_one_noisier_{path}_10x30")["default"]
    assert c.errors == 0, c.summary()
    assert "pooled_order_statistic,refused" in c.methods, c.summary()  # lent to, the lender refused
    _assert_keeps_promise(c)


# --------------------------------------------------------------------------- the simulation itself
def test_simulated_16_bit_rounding_is_round_to_nearest_even():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(20000) * rng.choice([1e-3, 1.0, 300.0], 20000)
    assert (ps.round_to(x, "float16") == x.astype(np.float16)).all()
    b = ps.round_to(x, "bfloat16")
    for step in (-1, 1):
        nb = ps.shift_ulps(b, np.full(b.shape, step)).astype(np.float64)
        assert (np.abs(b.astype(np.float64) - x) <= np.abs(nb - x)).all()
    mid = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8])  # bfloat16 ties
    assert ps.round_to(mid, "bfloat16").astype(np.float64).tolist() == [1.0, 1.0 + 2.0 ** -6]
    assert ps.shift_ulps(np.array([2.0 ** -24], np.float16), np.array([-2])).tolist() == [-(2.0 ** -24)]


def test_lattice_family_moves_by_geometric_ulps():
    p = ps.FAMILIES["lattice_bf16"].draw(np.random.default_rng(0), 20)
    steps = np.concatenate([ps._ordered(q.actual).ravel() - ps._ordered(ps.round_to(q.expected, "bfloat16")).ravel()
                            for q in p])
    k = np.abs(steps)
    assert p[0].actual.dtype == ps.NP_DTYPES["bfloat16"]
    assert abs(np.mean(k == 0) - 0.5) < 0.03 and abs(np.mean(k == 1) - 0.25) < 0.03


def test_clustered_variants_share_the_reference():
    p = ps.FAMILIES["clustered_k3_c0.9_declared"].draw(np.random.default_rng(0), 9)
    assert [q.labels["case"] for q in p] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert all(np.array_equal(p[0].expected, q.expected) for q in p[:3])
    d = [(q.actual.astype(np.float64) - q.expected).ravel() for q in p[:2]]
    assert np.corrcoef(d[0], d[1])[0, 1] > 0.6


def test_point_rule_inflation_matches_beta_binomial_monte_carlo():
    rng = np.random.default_rng(5)
    a, g, m, units = 0.01, 0.95, 1000, 300
    fp = rng.beta(1, units, 200000)  # the FP of the maximum of 300 continuous scores
    noisy = np.mean(rng.binomial(m, fp) > m * a)
    assert abs((noisy - np.mean(fp > a)) - ps.point_rule_inflation(units, a, g, m)) < 0.003
    assert ps.reference_min_units(a, g) == 299
    assert stats.beta.sf(a, 1, 299) <= 1 - g < stats.beta.sf(a, 1, 298)


# --------------------------------------------------------------------------- the whole grid
_REPS = int(os.environ.get("TOLSTAT_PROMISE_REPS", "12"))
# per-pair checks: a fresh set of 10/a runs per calibration; with check_runs: one shared set of 100/a.
# The slow run (and CI) takes the few-minute subset of the grid; TOLSTAT_PROMISE_GRID=full runs all
# of it (benchmarks/promise_table.py writes its table; with 100 calibrations per cell and check_runs
# the whole grid took 5,352 s on 2 cores, docs/promise_grid.md)
_GRID = (ps.full_batches(reps=_REPS, fresh_factor=None if ps.use_check_runs() else 10.0)
         if os.environ.get("TOLSTAT_PROMISE_GRID") == "full" else ps.quick_batches())


@pytest.mark.slow
@pytest.mark.parametrize("batch", _GRID, ids=[f"{b.family}/{b.path}/n={b.n}" for b in _GRID])
def test_promise_holds_on_the_grid(batch):
    """Every cell keeps its promise; cells without enough units are refused, the others are not."""
    results = ps.run_batch(batch)
    problems = [(f"promise (p = {c.p_excess:.2g}): " if c.significant_break else f"refusals (expected: {c.expect}): ")
                + c.summary() for c in results if not c.ok]
    assert not problems, "\n".join(problems)
