"""The stored format of a tolerance table: validation of its data before it is used.

:func:`check_table_data` refuses a table dataset (read from JSON or netCDF, or built by
:func:`tolstat.select`) whose groups, statistics, thresholds, counts or scale models are
not what :class:`~tolstat.calibration.table.ToleranceTable` can check with, naming the
field and the value.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat._base import validate as _validate

__all__ = ["check_table_data"]


def _uf(v: Any) -> float:
    """A number from JSON: numbers and the strings ``"inf"``/``"nan"`` written by :func:`_f`."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str, np.integer, np.floating)):
        raise ValueError(f"expected a number, got {v!r} ({type(v).__name__})")
    try:
        return float(v)  # float("inf"), float("nan") parse the string forms
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None


def _check_group_keys(groups: Sequence[Any], statistics: list[str]) -> None:
    """Every group of the JSON layout has the keys a table needs (clear error otherwise)."""
    for i, g in enumerate(groups):
        if not isinstance(g, Mapping):
            raise ValueError(f"table group {i} must be an object, got {type(g).__name__}")
        for k in ("op", "dtype", "hardware", "n", "statistics"):
            if k not in g:
                raise ValueError(f"table group {i} has no {k!r}")
        for k in ("op", "dtype", "hardware"):  # before numpy strings drop a trailing NUL
            _validate.label_value(f"table group {i} {k}", g[k])
        for st in statistics:
            if not isinstance(g["statistics"], Mapping) or st not in g["statistics"]:
                raise ValueError(f"table group {i} ({g['op']}, {g['dtype']}, {g['hardware']}) has no "
                                 f"entry for statistic {st!r}")
            for k in ("threshold", "estimate", "budget", "confidence", "method", "reason"):
                if k not in g["statistics"][st]:
                    raise ValueError(f"table group {i} statistic {st!r} has no {k!r}")


_NUM_SCALE = ("atol", "rtol", "unit", "floor")


def check_table_data(d: xr.Dataset, source: str | None = None) -> None:
    """Validate a table's values, so that no typo or edit can switch a check off.

    Checks: the variables and attributes exist; ``fp_budget`` in [1e-9, 0.5] and
    ``confidence`` in (0, 1); every statistic known; per statistic, a threshold that
    is finite and >= 0 (or NaN: a refused group, whose lookup raises), a budget and confidence in
    (0, 1); ``n >= 1``; the scale model: a known form, parameters finite, ``atol``,
    ``rtol``, ``unit``, ``floor`` and the linear weights >= 0, power references > 0, a
    baseline covariate named; the certificate against its typed form
    (:func:`~tolstat.calibration.certificate.check_table_certificate`: normalisers finite,
    > 0 and consistent with the group's statistic, present where a check needs them);
    labels free of control characters; no duplicate (op, dtype, hardware) group.

    The time is linear in the number of groups.

    Raises
    ------
    ValueError
        Naming the table (``source``), the group, the field, the value and what is allowed.
    """
    where = f" {source!r}" if source else ""

    def fail(msg: str) -> None:
        raise ValueError(f"invalid tolerance table{where}: {msg}")

    need = ("threshold", "estimate", "budget", "stat_confidence", "method", "reason", "n", "scale_json",
            "op", "dtype", "hardware", "statistic")
    missing = [v for v in need if v not in d.variables]
    if missing:
        fail(f"missing variable(s) {missing}")
    for a in ("fp_budget", "confidence", "statistics"):
        if a not in d.attrs:
            fail(f"missing attribute {a!r}")
    try:
        _validate.budget("fp_budget", d.attrs["fp_budget"])
        _validate.unit_interval("confidence", d.attrs["confidence"])
    except ValueError as exc:
        fail(str(exc))
    from tolstat.models.statistics import REGISTRY

    stats = [str(x) for x in d["statistic"].values]
    unknown = [x for x in stats if x not in REGISTRY]
    if unknown:
        fail(f"unknown statistic(s) {unknown}; known: {sorted(REGISTRY)}")
    groups = list(zip(*(map(str, d[k].values) for k in ("op", "dtype", "hardware"))))
    if len(set(groups)) != len(groups):
        seen = Counter(groups)
        fail(f"duplicate (op, dtype, hardware) groups {sorted(g for g, c in seen.items() if c > 1)}")
    for g in groups:
        for label, v in zip(("op", "dtype", "hardware"), g):
            try:
                _validate.label_value(label, v)
            except ValueError as exc:
                fail(str(exc))
    thr = np.asarray(d["threshold"].values, dtype=np.float64)
    bud = np.asarray(d["budget"].values, dtype=np.float64)
    conf = np.asarray(d["stat_confidence"].values, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # a NaN threshold is a refused group (its lookup raises): not checked
        bad_thr = ~np.isnan(thr) & ~(np.isfinite(thr) & (thr >= 0))
        bad_bud = ~np.isnan(thr) & ~((bud > 0.0) & (bud < 1.0))
        bad_conf = ~np.isnan(thr) & ~((conf > 0.0) & (conf < 1.0))
    bad = bad_thr | bad_bud | bad_conf
    if bad.any():  # the first bad (group, statistic), its first bad field
        i, j = np.unravel_index(int(np.argmax(bad)), bad.shape)
        name = f"group {groups[i]} statistic {stats[j]!r}"
        if bad_thr[i, j]:
            fail(f"{name}: threshold must be a finite number >= 0, got {float(thr[i, j])!r}")
        label, v = ("budget", bud[i, j]) if bad_bud[i, j] else ("confidence", conf[i, j])
        fail(f"{name}: {label} must lie in (0, 1), got {float(v)!r}")
    n = np.asarray(d["n"].values)
    if n.dtype.kind not in "iu" or (n < 1).any():
        fail(f"'n' (calibration runs) must be integers >= 1, got {n.tolist()[:5]}")
    for i, sj in enumerate(map(str, d["scale_json"].values)):
        if sj:
            _check_scale(sj, f"group {groups[i]}", fail)
    if "certificate_json" in d.variables:
        main = next((j for j, s in enumerate(stats) if s != "bias"), 0)
        for i, cj in enumerate(map(str, d["certificate_json"].values)):
            if cj:
                _check_certificate(cj, groups[i], stats[main], not math.isnan(float(thr[i, main])), fail)


def _check_certificate(cj: str, group: tuple[str, str, str], statistic: str, certified: bool, fail: Any) -> None:
    from tolstat.calibration.certificate import check_table_certificate

    name = f"group {group}"
    try:
        cert = json.loads(cj)
    except (ValueError, RecursionError) as exc:
        fail(f"{name}: certificate is not valid JSON ({type(exc).__name__})")
    try:
        check_table_certificate(cert, op=group[0], statistic=statistic, certified=certified)
    except ValueError as exc:
        fail(f"{name}: {exc}")


def _check_scale(sj: str, name: str, fail: Any) -> None:
    try:
        sd = json.loads(sj)
    except (ValueError, RecursionError) as exc:
        fail(f"{name}: scale model is not valid JSON ({type(exc).__name__})")
    if not isinstance(sd, dict) or "form" not in sd:
        fail(f"{name}: scale model must be an object with a 'form'")
    from tolstat.models.scale import FORMS

    if sd["form"] not in FORMS:
        fail(f"{name}: scale form {sd['form']!r} is not one of {FORMS}")
    for k in ("linear", "power"):
        if sd.get(k) is not None and not isinstance(sd[k], dict):
            fail(f"{name}: scale {k} must be an object {{covariate: ...}}, got {sd[k]!r}")
    nums = [(k, sd.get(k)) for k in _NUM_SCALE if k in sd]
    nums += [(f"linear[{k!r}]", v) for k, v in (sd.get("linear") or {}).items()]
    for k, v in (sd.get("power") or {}).items():
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            fail(f"{name}: scale power[{k!r}] must be [exponent, reference], got {v!r}")
        nums += [(f"power[{k!r}][0]", v[0]), (f"power[{k!r}][1]", v[1])]
    for k, v in nums:
        try:
            f = _uf(v)
        except ValueError as exc:
            fail(f"{name}: scale {k}: {exc}")
        if not math.isfinite(f):
            fail(f"{name}: scale {k} must be finite, got {v!r}")
        if (k in _NUM_SCALE or k.startswith("linear[")) and f < 0:
            fail(f"{name}: scale {k} must be >= 0, got {v!r}")
        if k.startswith("power[") and k.endswith("[1]") and f <= 0:
            fail(f"{name}: scale {k} (reference) must be > 0, got {v!r}")
    if sd["form"] == "baseline" and not (isinstance(sd.get("baseline"), str) and sd["baseline"]):
        fail(f"{name}: scale baseline must name the covariate of the baseline error, got {sd.get('baseline')!r}")
