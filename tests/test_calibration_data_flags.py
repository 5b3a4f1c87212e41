"""Calibration flags data that cannot come from independent correct runs.

Through the public API (``from_pairs`` -> ``select``): identical runs (an input generator
that ignores its seed) are one unit, so they cannot certify a budget; a run far beyond the
rest that would set a group's threshold raises an ``OutlierRunWarning`` and flags the
certificate unless accepted explicitly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tolstat
from tolstat.calibration.certificate import OUTLIER_RATIO, OutlierRunWarning
from tolstat.calibration.engine import CertifyOptions, certify


def _pairs(n: int, seed: int = 0, *, blow_up: dict[int, float] | None = None) -> list[tuple]:
    """``n`` correct fp16 runs of a rounded 32-element reference; run ``i`` of ``blow_up``
    gets an error ``blow_up[i]`` times the usual one."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        e = rng.standard_normal(32)
        a = (e + rng.standard_normal(32) * 2.0 ** -11 * np.abs(e)).astype(np.float16)
        if blow_up and i in blow_up:
            a = (e + (a.astype(np.float64) - e) * blow_up[i]).astype(np.float16)
        out.append((a, e))
    return out


def _flags(table) -> tuple[str, ...]:
    (group,) = table.groups
    return tuple(table.entry(*group).certificate.get("flags", ()))


def test_identical_runs_are_one_unit_and_cannot_certify_a_budget():
    same = _pairs(1)[0]
    ds = tolstat.from_pairs([same] * 400, op="mm", dtype="float16")
    with pytest.raises(tolstat.NotEnoughData, match="400 runs are only 1 independent units.*distinct inputs"):
        tolstat.select(ds, fp_budget=0.01)


@pytest.mark.parametrize("form", ["default", "allclose", None])
def test_one_run_far_beyond_the_rest_that_sets_the_threshold_is_flagged(form):
    ds = tolstat.from_pairs(_pairs(300, blow_up={7: 1e4}), op="mm", dtype="float16")
    kw = {} if form == "default" else {"form": form}
    with pytest.warns(OutlierRunWarning, match="group .*accept_outliers=True"):
        table = tolstat.select(ds, fp_budget=0.01, **kw)
    assert "outlier" in _flags(table)


def test_accepted_outliers_are_flagged_without_a_warning():
    ds = tolstat.from_pairs(_pairs(300, blow_up={7: 1e4}), op="mm", dtype="float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierRunWarning)
        table = tolstat.select(ds, fp_budget=0.01, options=tolstat.SelectOptions(accept_outliers=True))
    assert "outlier_accepted" in _flags(table) and "outlier" not in _flags(table)


def test_correct_runs_raise_no_outlier_warning():
    ds = tolstat.from_pairs(_pairs(300, seed=3), op="mm", dtype="float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierRunWarning)
        table = tolstat.select(ds, fp_budget=0.01)
    assert not {"outlier", "outlier_accepted"} & set(_flags(table))


def test_outlier_rule_compares_the_threshold_with_the_next_score_or_the_floor():
    base = np.linspace(1.0, 2.0, 299)
    just_below = np.append(base, 2.0 * OUTLIER_RATIO * 0.999)
    beyond = np.append(base, 2.0 * OUTLIER_RATIO * 1.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierRunWarning)
        res = certify({"T": just_below}, fp_budget=0.01)
    assert "outlier" not in res.groups["all"].flags
    with pytest.warns(OutlierRunWarning):
        res = certify({"T": beyond}, fp_budget=0.01)
    assert "outlier" in res.groups["all"].flags
    # one positive score among exact zeros is compared with the floor, not with 0
    lone = np.append(np.zeros(299), 5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierRunWarning)
        res = certify({"T": lone}, fp_budget=0.01, floor=1.0)
    assert "outlier" not in res.groups["all"].flags
    with pytest.warns(OutlierRunWarning):
        res = certify({"T": np.append(np.zeros(299), 500.0)}, fp_budget=0.01, floor=1.0)
    assert "outlier" in res.groups["all"].flags


def test_outlier_rule_sees_a_pooled_threshold():
    rng = np.random.default_rng(5)
    stats = np.abs(rng.standard_normal(300))
    stats[17] = 1e4 * stats.max()
    groups = np.repeat([f"g{i}" for i in range(10)], 30)
    with pytest.warns(OutlierRunWarning):
        res = certify({"T": stats}, groups, fp_budget=0.01, on_refusal="record")
    assert any("outlier" in c.flags for c in res.groups.values())


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_accept_outliers_must_be_a_flag(bad):
    with pytest.raises(TypeError, match="accept_outliers"):
        CertifyOptions(accept_outliers=bad)
    with pytest.raises(TypeError, match="accept_outliers"):
        tolstat.SelectOptions(accept_outliers=bad)
