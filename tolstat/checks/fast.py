"""The fast path of :func:`tolstat.check`: table entries parsed once, one fused pass.

A check of a table entry whose statistics are ``max_abs`` or ``max_rel`` (optionally
with ``bias``) needs only what :func:`tolstat.measure.fused.fused_max` computes in one pass;
it never builds the element-wise :class:`tolstat.measure.ErrorMetrics`. Anything else (a
scale model, ``max_ulp``, a statistic it does not know, a NaN/Inf in either array)
returns None and :func:`tolstat.check` takes the general path, which is the definition:
``tests/test_fastcheck.py`` checks both give the same :class:`CheckResult`.

Parsed table entries are cached per table and lookup key. A table's dataset is treated
as immutable (as every tolstat function treats it): assigning a new ``table.data``
invalidates the cache; modifying its arrays in place is not detected.

Layer: checks.
"""

from __future__ import annotations

import weakref
from typing import Any, Mapping

import numpy as np

from tolstat._base.dtypes import round_to_format, target_dtype
from tolstat._base.validate import float_array
from tolstat.measure.fused import fused_max
from tolstat.models.statistics import bias_score
from tolstat.calibration.table import ToleranceEntry, ToleranceTable
from tolstat.checks.result import CheckResult

__all__ = ["cached_entry", "fast_check"]

_ENTRIES: "weakref.WeakKeyDictionary[ToleranceTable, tuple[int, dict[tuple, ToleranceEntry]]]" = (
    weakref.WeakKeyDictionary())
_FAST_MAX = {"max_abs": "abs", "max_rel": "rel"}
_FAST_RUN = frozenset({"bias"})


def cached_entry(table: ToleranceTable, op: str, dtype: str, hardware: str | None, **kw: Any) -> ToleranceEntry:
    """``table.entry(op, dtype, hardware, **kw)``, parsed once per table and key."""
    key = (op, dtype, hardware, tuple(sorted(kw.items())))
    data_id = id(table.data)
    hit = _ENTRIES.get(table)
    if hit is None or hit[0] != data_id:
        hit = (data_id, {})
        _ENTRIES[table] = hit
    cache = hit[1]
    ent = cache.get(key)
    if ent is None:
        ent = table.entry(op, dtype, hardware, **kw)
        cache[key] = ent
    return ent


def fast_check(a: np.ndarray, e: np.ndarray, ent: ToleranceEntry,
               covariates: Mapping[str, Any] | None) -> CheckResult | None:
    """The :class:`~tolstat.checks.result.CheckResult` of one pair, or None where the
    general path is needed."""
    name = ent.max_statistic
    score = _FAST_MAX.get(name)
    if score is None or ent.scale is not None or any(k != name and k not in _FAST_RUN for k in ent.statistics):
        return None
    float_array("actual", a)
    float_array("expected", e)
    if a.shape != e.shape or a.size == 0:
        return None  # the general path raises the error
    floor = target_dtype(ent.dtype).tiny
    c = ent.statistics[name].threshold
    r = fused_max(a, e, score=score, threshold=c, rel_floor=floor)
    if r is None:
        return None
    n = int(a.size)
    # the decision values (tolstat.calibration.decision): 0 for a correctly rounded output
    cr = r.value > 0 and _correctly_rounded(a, e, ent.dtype)
    values = {name: 0.0 if cr else r.value}
    for k in ent.statistics:
        if k == "bias":
            values[k] = 0.0 if cr or r.value == 0 else float(bias_score(r.sum_signed / n, r.sum_abs / n, n))
    thresholds = {k: ent.statistics[k].threshold for k in values}
    idx = tuple(int(i) for i in np.unravel_index(r.index, a.shape)) if a.shape else ()
    allowed = c if score == "abs" else c * max(abs(r.expected), floor)
    return CheckResult.of_entry(
        ent, values, thresholds, covariates=covariates,
        worst_index=idx, worst_actual=r.actual, worst_expected=r.expected,
        worst_error=abs(r.actual - r.expected), worst_allowed=float(allowed),
        n_elements=n, n_exceeding=0 if cr else r.n_exceeding, n_nonfinite=0,
        correctly_rounded=bool(cr or r.value == 0),
    )


def _correctly_rounded(a: np.ndarray, e: np.ndarray, dtype: str) -> bool:
    """Every element of a finite pair is the reference rounded to nearest in ``dtype``
    (the ULP distance of :func:`tolstat.error_metrics` is 0 everywhere)."""
    rn = round_to_format(e, dtype, overflow="clamp")
    return bool(np.array_equal(np.asarray(a).astype(np.float64), rn.astype(np.float64)))
