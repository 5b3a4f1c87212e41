"""Synthetic tolerance tables with chosen thresholds (for boundary and message tests)."""

from __future__ import annotations

import dataclasses
import math

from tolstat.calibration.table import ToleranceTable


def stat(threshold, *, top=(), tail=None, method="order_statistic"):
    """One statistic's entry in the JSON group layout."""
    return {"threshold": threshold, "estimate": threshold, "budget": 0.01, "confidence": 0.95,
            "method": method, "reason": "test", "tail": tail or {}, "top_scores": list(top)}


def group(op, dtype, hw, threshold, *, statistic="max_abs", n=400, extra=None, **kw):
    """A group with one statistic (and optionally ``extra = {name: stat(...)}``)."""
    st = {statistic: stat(threshold, **kw)}
    st.update(extra or {})
    return {"op": op, "dtype": dtype, "hardware": hw, "n": n, "scale": None, "statistics": st}


def table(groups, statistic="max_abs", extra=()):
    """A table of ``groups`` with statistics ``[statistic, *extra]``."""
    return ToleranceTable.from_groups(groups, {"fp_budget": 0.01, "confidence": 0.95,
                                               "statistics": [statistic, *extra]})


def _same_value(x, y) -> bool:
    """Equal values; two NaN floats are equal, and a float's zero keeps its sign."""
    if isinstance(x, float) and isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
    return x == y


def assert_same_result(got, want, *, types: bool = False) -> None:
    """Two ``CheckResult`` objects field for field (dict fields key by key) and their
    messages; with ``types``, each field's type too."""
    dg, dw = dataclasses.asdict(got), dataclasses.asdict(want)
    assert dg.keys() == dw.keys()
    for k, v in dw.items():
        g = dg[k]
        if isinstance(v, dict):
            assert g.keys() == v.keys(), k
            for s in v:
                assert _same_value(g[s], v[s]), (k, s, g[s], v[s])
        else:
            assert _same_value(g, v), (k, g, v)
        if types:
            assert type(g) is type(v), (k, type(g), type(v))
    assert got.message() == want.message()
