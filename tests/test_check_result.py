"""CheckResult.of_entry: the verdict of a check, and a result equal to the dataclass's own."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest

import tolstat
from tolstat.calibration.decision import ratio_value
from tolstat.checks.result import CheckResult


@pytest.fixture(scope="module")
def entry():
    rng = np.random.default_rng(0)
    refs = rng.standard_normal((200, 64))
    pairs = [((e + 1e-3 * rng.standard_normal(64)).astype(np.float16), e) for e in refs]
    ds = tolstat.from_pairs(pairs, op="add", dtype="float16", options=tolstat.CollectOptions(progress=False))
    return tolstat.select(ds, form=None, fp_budget=0.05, statistic=["max_abs", "bias"]).entry("add", "float16")


WHERE = dict(worst_index=(3,), worst_actual=1.0, worst_expected=1.5, worst_error=0.5, worst_allowed=0.25,
             n_elements=64, n_exceeding=2, n_nonfinite=0, atol=0.1, rtol=0.0)


def _by_constructor(entry, values, thresholds, probabilities, notes, **where):
    failed = tuple(k for k, v in values.items() if v > thresholds[k])
    return CheckResult(
        passed=not failed, op=entry.op, dtype=entry.dtype, hardware=entry.hardware, fallback=entry.fallback,
        statistics=dict(values), thresholds=dict(thresholds),
        ratios={k: ratio_value(v, thresholds[k]) for k, v in values.items()}, probabilities=dict(probabilities),
        notes=dict(notes), failed=failed, fp_budget=entry.fp_budget, confidence=entry.confidence,
        methods={k: entry.statistics[k].method for k in values}, n_calibration=entry.n,
        guarantee=str((entry.certificate or {}).get("guarantee", "")), **where)


@pytest.mark.parametrize("scale", [0.5, 2.0])
@pytest.mark.parametrize("rounded", [False, True])
def test_of_entry_equals_the_result_the_dataclass_constructor_makes(entry, scale, rounded):
    thr = {k: entry.statistics[k].threshold for k in ("max_abs", "bias")}
    values = {k: scale * t for k, t in thr.items()}
    probs, notes = dict.fromkeys(values, 0.25), dict.fromkeys(values, "empirical")
    where = dict(WHERE, correctly_rounded=rounded)
    got = CheckResult.of_entry(entry, values, thr, probabilities=probs, notes=notes, **where)
    want = _by_constructor(entry, values, thr, probs, notes, **where)
    assert got == want
    assert got.passed is (scale < 1) and bool(got) is (scale < 1)
    assert got.correctly_rounded is rounded
    assert pickle.loads(pickle.dumps(got)) == got
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.passed = True  # type: ignore[misc]


def test_of_entry_defaults_correctly_rounded_to_false_and_estimates_probabilities_on_first_use(entry):
    thr = {k: entry.statistics[k].threshold for k in ("max_abs", "bias")}
    values = {k: 0.5 * t for k, t in thr.items()}
    got = CheckResult.of_entry(entry, values, thr, **WHERE)
    assert got.correctly_rounded is False
    assert "probabilities" not in got.__dict__
    assert set(got.probabilities) == set(values) and all(0 <= p <= 1 for p in got.probabilities.values())
    assert set(got.notes) == set(values)
    assert all(t > 0 for t in thr.values())
    assert got.ratios == pytest.approx({k: 0.5 for k in values})


def test_of_entry_refuses_fields_the_result_does_not_have_and_names_missing_ones(entry):
    thr = {"max_abs": entry.statistics["max_abs"].threshold}
    with pytest.raises(TypeError, match="unexpected fields.*worst_place"):
        CheckResult.of_entry(entry, {"max_abs": 0.0}, thr, **WHERE, worst_place=1)
    partial = {k: v for k, v in WHERE.items() if k != "n_exceeding"}
    with pytest.raises(TypeError, match="missing the fields.*n_exceeding"):
        CheckResult.of_entry(entry, {"max_abs": 0.0}, thr, **partial)
    assert not math.isnan(thr["max_abs"])
