"""Re-budgeting (suite budgets): a smaller budget's thresholds from what the table stored, or a refusal."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import tolstat
from tolstat.checks.pytest_plugin import suite_table
from tolstat.calibration.selection import rebudget

HW = "sim"


def _pairs(seed: int, n: int, scale: float = 1.0):
    """A correct elementwise fp16 kernel with extra noise of a known law (t, 3 d.o.f.)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ref = rng.standard_normal(8) * 4
        noise = rng.standard_t(3, size=8) * scale * 2.0 ** -11 * (np.abs(ref) + 1)
        out.append((np.asarray(ref + noise).astype(np.float16), ref))
    return out


def _ds(pairs, op="mul"):
    return tolstat.from_pairs(pairs, op=op, dtype="fp16", hardware=HW, options=tolstat.CollectOptions(progress=False))


@pytest.fixture(scope="module")
def big():
    return _ds(_pairs(3, 3300))


@pytest.mark.parametrize("form", ["auto", None], ids=["default", "plain"])
def test_rebudgeted_thresholds_equal_select_at_the_smaller_budget(big, form):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t1 = tolstat.select(big, fp_budget=0.01, form=form)
        t3 = tolstat.select(big, fp_budget=0.001, form=form)
    r = rebudget(t1, 0.001)
    assert r.fp_budget == 0.001
    e1, e3 = r.entry("mul", "fp16", HW), t3.entry("mul", "fp16", HW)
    (name,) = e3.statistics
    assert e1.statistics[name].threshold == e3.statistics[name].threshold
    assert e1.statistics[name].threshold > t1.entry("mul", "fp16", HW).statistics[name].threshold


def test_rebudget_refuses_a_group_with_too_few_units_and_never_keeps_its_threshold():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tolstat.select(_ds(_pairs(4, 400)), fp_budget=0.01, form=None)
    r = rebudget(t, 0.001)
    with pytest.raises(KeyError, match="2995"):
        r.entry("mul", "fp16", HW)
    assert r.fp_budget == 0.001
    # the plugin's suite budget goes through the same rule
    s = suite_table(t, 0.01, 10)
    with pytest.raises(KeyError, match="order statistic"):
        s.entry("mul", "fp16", HW)


def test_rebudget_refuses_pooled_groups():
    parts = [_ds(_pairs(10 + i, 40), op=f"op{i}") for i in range(10)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tolstat.select(tolstat.concat(parts), fp_budget=0.01, form=None)
    methods = {k: str(m) for k, m in zip(t.groups, t.data["method"].values[:, 0])}
    assert set(methods.values()) == {"pooled_order_statistic"}, methods
    r = rebudget(t, 0.005)
    for op, dt, hw in t.groups:
        with pytest.raises(KeyError, match="not an order statistic of its own"):
            r.entry(op, dt, hw)


def test_rebudget_rejects_a_larger_budget(big):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tolstat.select(big, fp_budget=0.01, form=None)
    with pytest.raises(ValueError, match="only be re-budgeted to a smaller budget"):
        rebudget(t, 0.02)


@pytest.mark.slow
def test_a_suite_budgeted_table_keeps_the_suite_budget_on_fresh_runs():
    """R calibrations of 3,300 runs at 1 %, each re-budgeted for a suite of 10 checks at 1 %
    (0.1 % per check): the share of calibrations whose per-check FP rate on fresh runs
    exceeds 0.1 % stays within 1 - confidence + 2 MC s.e."""
    fresh = _ds(_pairs(999, 30000))
    reps, over = 24, 0
    for rep in range(reps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = tolstat.select(_ds(_pairs(100 + rep, 3300)), fp_budget=0.01)
        s = suite_table(t, 0.01, 10)
        fp = 1.0 - float(np.mean(tolstat.check_runs(fresh, s)))
        over += fp > 0.001
    v = 0.05
    assert over / reps <= v + 2 * math.sqrt(v * (1 - v) / reps) + 1e-12, over


def test_a_rebudgeted_table_records_the_budget_it_applied_and_the_one_it_had(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tolstat.select(_ds(_pairs(4, 400)), fp_budget=0.01, form=None)
    r = rebudget(t, 0.001, why="a suite of 10 checks")
    want = {"fp_budget": 0.001, "table_fp_budget": 0.01, "why": "a suite of 10 checks"}
    assert r.meta["provenance"]["rebudget"] == want
    r.to_json(tmp_path / "r.json")
    assert tolstat.load_table(tmp_path / "r.json").meta["provenance"]["rebudget"] == want
    # the plugin's suite budget records the same, with the suite
    s = suite_table(t, 0.01, 10).meta["provenance"]
    assert s["rebudget"]["fp_budget"] == s["suite_budget"]["per_check"] == pytest.approx(0.001, rel=1e-12)
    assert s["rebudget"]["table_fp_budget"] == 0.01
