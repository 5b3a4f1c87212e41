"""Synthetic tolerance tables with chosen thresholds (for boundary and message tests)."""

from __future__ import annotations

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
