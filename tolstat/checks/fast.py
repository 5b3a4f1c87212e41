"""The fast path of :func:`tolstat.check`: table entries parsed once, one fused pass.

A check of a table entry whose max-error statistic is ``max_abs``, ``max_rel`` or
``max_score`` (any scale model: the forms ``allclose``, ``size_aware``, ``normalised``,
``baseline`` and the scale ``form="auto"`` picks on plain pairs), optionally with
``bias``, needs of the pair only what :func:`tolstat.measure.fused.check_pass` computes in
one numba pass: the largest element score ``|d_i| / s_i``, where it is, how many elements
exceed the threshold, ``max |ref|``, and whether the output is correctly rounded (the
decision value is then 0, :mod:`tolstat.calibration.decision`). It never builds the
element-wise :class:`tolstat.measure.ErrorMetrics`. A scale model that needs ``ref_rms``
adds one pass over the reference (numpy's pairwise sum, bit for bit); ``bias`` one over
the pair.

The result is final, passed or failed: every number of the :class:`CheckResult` is the
one the general path (:func:`tolstat.checks.checking.check_metrics`, the definition)
computes, bit for bit (``tests/test_fastcheck.py``). Anything the fast path does not
cover returns None and :func:`tolstat.check` takes the general path: a NaN/Inf in either
array (the non-finite rules, ``allow_nan``, the broken-reference error), ``max_ulp``, a
statistic it does not know, a missing or invalid covariate (the general path raises the
error), empty or mismatched arrays.

Parsed table entries and their check plans (:class:`CheckPlan`: thresholds, the scale
model's coefficients, the target format's layout) are cached per table and lookup key.
A table's dataset is treated as immutable (as every tolstat function treats it):
assigning a new ``table.data`` invalidates the cache; modifying its arrays in place is
not detected.

Layer: checks.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping

import numpy as np

from tolstat._base.dtypes import TargetDtype, target_dtype
from tolstat._base.validate import float_array
from tolstat.measure.fused import CheckPass, check_pass, error_sums, format_layout, sum_of_squares
from tolstat.measure.metrics import ulp_distance
from tolstat.models.statistics import bias_score
from tolstat.calibration.decision import carried_values, size_factors
from tolstat.calibration.table import ToleranceEntry, ToleranceTable
from tolstat.checks.result import CheckResult

__all__ = ["CheckPlan", "cached_entry", "cached_plan", "plan_of", "fast_check", "cr_mode", "finish_cr", "unravel"]

_ENTRIES: "weakref.WeakKeyDictionary[ToleranceTable, tuple[int, dict[tuple, CheckPlan]]]" = (
    weakref.WeakKeyDictionary())
_MODES = {"max_abs": "abs", "max_rel": "rel", "max_score": "scale"}
_RUN_STATS = frozenset({"bias"})
_BUILTIN = ("n_elements", "ref_max_abs", "ref_rms")
_TINY64 = float(np.finfo(np.float64).tiny)
#: exact correctly-rounded tests of :func:`tolstat.measure.fused.check_pass` by target format
#: (an output stored in that format); any other output takes ``"loose"`` and the ULP distance
_CR_IN_FORMAT = {"float16": "interval", "bfloat16": "interval", "float8_e4m3fn": "interval",
                 "float8_e5m2": "interval", "float32": "f32", "float64": "f64"}

def cr_mode(actual: np.ndarray, td: TargetDtype) -> str:
    """The ``cr`` of :func:`tolstat.measure.fused.check_pass` for an output: exact for one
    stored in the target format, ``"loose"`` (then :func:`finish_cr`) otherwise."""
    return _CR_IN_FORMAT.get(td.name, "loose") if actual.dtype == td.np_dtype else "loose"


def finish_cr(res: CheckPass, cr_mode: str, a: np.ndarray, e: np.ndarray, td: TargetDtype) -> bool:
    """The correctly rounded flag of a finite pair (``pair_is_correctly_rounded``): the
    pass's own where it is exact, else (``"loose"``, only a necessary condition) the ULP
    distance of the definition."""
    if cr_mode != "loose" or not res.correctly_rounded:
        return res.correctly_rounded
    return bool(np.max(ulp_distance(a, e, td.name)) == 0.0)


def unravel(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``tuple(int(k) for k in numpy.unravel_index(i, shape))`` (``()`` for a 0-d shape)."""
    if len(shape) <= 1:
        return (int(i),) if shape else ()
    out = []
    for n in reversed(shape):
        i, k = divmod(i, n)
        out.append(int(k))
    return tuple(reversed(out))


class CheckPlan:
    """What the fast path needs of one table entry, worked out once.

    Attributes
    ----------
    entry : ToleranceEntry
        The table group.
    mode : str or None
        Element score of :func:`tolstat.measure.fused.check_pass` (``abs``, ``rel``,
        ``scale``); None where the fast path does not apply (the general path decides).
    name : str
        The max-error statistic.
    threshold : float
        Its threshold.
    run_stats : tuple of str
        The whole-output statistics checked alongside (``bias``).
    """

    __slots__ = ("entry", "mode", "name", "threshold", "run_stats", "td", "layout", "cr_in_format", "model",
                 "baseline", "linear", "power", "needs", "floor", "floor_eps", "_mult")

    def __init__(self, entry: ToleranceEntry) -> None:
        self.entry = entry
        self.mode: str | None = None
        self.name = ""
        self.threshold = math.nan
        self.run_stats: tuple[str, ...] = ()
        self._mult: dict[tuple[float, ...], float] = {}
        if entry.operator or not entry.statistics:
            return
        name = entry.max_statistic
        mode = _MODES.get(name)
        if mode is None or any(k != name and k not in _RUN_STATS for k in entry.statistics):
            return
        model = entry.scale
        if (mode == "scale") != (model is not None):
            return  # max_score without a model (the general path raises), or a model on a plain statistic
        self.td = target_dtype(entry.dtype)
        self.layout = format_layout(self.td)
        self.cr_in_format = _CR_IN_FORMAT.get(self.td.name, "loose")
        self.name = name
        self.threshold = float(entry.statistics[name].threshold)
        self.run_stats = tuple(k for k in entry.statistics if k != name)
        self.floor = float(self.td.tiny)
        self.model = model
        self.baseline = model is not None and model.form == "baseline"
        self.floor_eps = float(model.floor * self.td.eps) if self.baseline else 0.0
        self.linear = tuple(model.linear.items()) if model is not None else ()
        self.power = tuple((k, b, r) for k, (b, r) in model.power.items()) if model is not None else ()
        self.needs = tuple(model.covariates) if model is not None else ()
        self.mode = mode

    def mult(self, cov: Mapping[str, Any]) -> float | None:
        """The multiplicative run factor of the scale (``ScaleModel.run_factor``, the same
        numpy operations), cached by the power covariates' values; None for a value the
        definition refuses (``<= 0``)."""
        key = tuple(float(cov[k]) for k, _, _ in self.power)
        got = self._mult.get(key)
        if got is None:
            mult: Any = 1.0
            for (_, beta, ref), v in zip(self.power, key):
                x = np.asarray(v, dtype=np.float64)
                if np.any(~(x > 0)):
                    return None
                mult = mult * (x / ref) ** beta
            got = float(mult)
            if len(self._mult) > 256:
                self._mult.clear()
            self._mult[key] = got
        return got


def cached_plan(table: ToleranceTable, op: str, dtype: str, hardware: str | None, **kw: Any) -> CheckPlan:
    """The :class:`CheckPlan` of ``table.entry(op, dtype, hardware, **kw)``, made once per table and key."""
    key = (op, dtype, hardware, tuple(sorted(kw.items())))
    data_id = id(table.data)
    hit = _ENTRIES.get(table)
    if hit is None or hit[0] != data_id:
        hit = (data_id, {})
        _ENTRIES[table] = hit
    cache = hit[1]
    plan = cache.get(key)
    if plan is None:
        plan = CheckPlan(table.entry(op, dtype, hardware, **kw))
        cache[key] = plan
    return plan


def cached_entry(table: ToleranceTable, op: str, dtype: str, hardware: str | None, **kw: Any) -> ToleranceEntry:
    """``table.entry(op, dtype, hardware, **kw)``, parsed once per table and key."""
    return cached_plan(table, op, dtype, hardware, **kw).entry


_PLANS: dict[int, tuple[ToleranceEntry, CheckPlan]] = {}


def by_identity(cache: dict[int, tuple[Any, Any]], obj: Any, make: Any) -> Any:
    """``make(obj)``, cached in ``cache`` by the identity of ``obj`` (kept alive with its
    value, so an identity is never reused while cached; at most 257 entries)."""
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = make(obj)
    if len(cache) > 256:
        cache.clear()
    cache[id(obj)] = (obj, value)
    return value


def plan_of(entry: ToleranceEntry | CheckPlan) -> CheckPlan:
    """The :class:`CheckPlan` of an entry given directly (cached by identity, :func:`by_identity`)."""
    if isinstance(entry, CheckPlan):
        return entry
    return by_identity(_PLANS, entry, CheckPlan)


def fast_check(a: np.ndarray, e: np.ndarray, ent: ToleranceEntry | CheckPlan,
               covariates: Mapping[str, Any] | None) -> CheckResult | None:
    """The :class:`~tolstat.checks.result.CheckResult` of one pair, or None where the
    general path is needed.

    Parameters
    ----------
    a, e : numpy.ndarray
        Output and reference (:func:`tolstat.measure.metrics.as_array` of them).
    ent : ToleranceEntry or CheckPlan
        The table group.
    covariates : mapping, optional
        The user's validated run covariates (no computed ones).
    """
    plan = plan_of(ent)
    mode = plan.mode
    if mode is None:
        return None
    float_array("actual", a)
    float_array("expected", e)
    if a.shape != e.shape or a.size == 0:
        return None  # the general path raises the error
    af = a.ravel()
    ef = (e if e.dtype == np.float64 else np.asarray(e, dtype=np.float64)).ravel()
    n = ef.size
    c = plan.threshold
    cov: dict[str, Any] = dict(covariates) if covariates else {}
    cov["n_elements"] = float(n)
    rms = None
    if "ref_rms" in plan.needs:
        rms = math.sqrt(sum_of_squares(ef) / n)  # numpy's sqrt(mean(square(|e|))), bit for bit
        cov["ref_rms"] = rms
    if "ref_max_abs" in plan.needs:
        cov["ref_max_abs"] = float(np.max(np.abs(ef)))
    got = _coefficients(plan, cov)
    if got is None:
        return None
    coef, add, mult = got
    crm = plan.cr_in_format if af.dtype == plan.td.np_dtype else "loose"
    # an output larger than every calibration run: its maxima carried to its size, its bias
    # read at the calibrated size (decision.beyond_calibrated_size); the allowances with them
    factors = size_factors(plan.entry, n)
    f = 1.0 if factors is None else float(factors[0])
    res = check_pass(af, ef, mode=mode, coef=coef, threshold=c * f, cr=crm, layout=plan.layout)
    if res is None:
        return None
    cr = finish_cr(res, crm, af, ef, plan.td)
    name = plan.name
    values = {name: 0.0 if cr else res.value}
    if plan.run_stats:  # bias: Statistic.value of the metrics (pairwise means, as numpy)
        s_d = s_ad = 0.0
        if not cr:
            s_d, s_ad = error_sums(af, ef)
        for k in plan.run_stats:
            values[k] = 0.0 if cr else float(bias_score(s_d / n, s_ad / n, n))
    values = carried_values(values, factors)
    thresholds = {k: plan.entry.statistics[k].threshold for k in values}
    # the (atol, rtol) form of ToleranceEntry.allclose(metric covariates): NaN where it
    # has none, or where a covariate is not finite (its validation refuses it)
    if rms is None and not res.ref_max_abs * res.ref_max_abs * n < 1e300:
        rms = math.sqrt(sum_of_squares(ef) / n)
    atol, rtol = _allclose(plan, add, mult, rms is None or math.isfinite(rms))
    return CheckResult.of_entry(
        plan.entry, values, thresholds, atol=atol * f, rtol=rtol * f,
        worst_index=unravel(res.index, a.shape), worst_actual=res.actual, worst_expected=res.expected,
        worst_error=abs(res.actual - res.expected), worst_allowed=_allowed(plan, coef, abs(res.expected)) * f,
        n_elements=n, n_exceeding=0 if cr else res.n_exceeding, n_nonfinite=0, correctly_rounded=cr,
    )


def _coefficients(plan: CheckPlan, cov: Mapping[str, Any]) -> tuple[tuple[float, ...], float, float] | None:
    """``(coef, add, mult)`` of the element score (:func:`tolstat.measure.fused.check_pass`),
    computed as :meth:`tolstat.models.ScaleModel.scale` does; None where a covariate is
    missing or refused (the general path raises the error)."""
    add = mult = 0.0
    if plan.mode == "rel":
        return (plan.floor, 0.0, 0.0, 0.0, 0.0), add, mult
    if plan.mode != "scale":
        return (0.0, 0.0, 0.0, 0.0, 0.0), add, mult
    if any(k not in cov for k in plan.needs):
        return None
    if plan.baseline:  # max(max(b, floor * eps * ref_rms), tiny), with numpy.maximum's NaN rule
        b, x = float(cov[plan.model.baseline]), plan.floor_eps * cov["ref_rms"]
        s0 = b if (b >= x or b != b) else x
        s0 = s0 if (s0 >= _TINY64 or s0 != s0) else _TINY64
        return (s0, 0.0, 1.0, 0.0, 1.0), add, mult  # s = 1 * ((s0 + 0 * r) + 0) * 1 = s0
    m = plan.mult(cov)
    if m is None:
        return None
    for k, w in plan.linear:  # ScaleModel.run_factor: 0.0 + w_1 * L_1 + ...
        add = add + w * float(cov[k])
    return (plan.model.atol, plan.model.rtol, plan.model.unit, add, m), add, m


def _allowed(plan: CheckPlan, coef: tuple[float, ...], r: float) -> float:
    """The largest ``|d|`` the max threshold allows at an element with ``|ref| = r``
    (``Statistic.allowed``)."""
    c = plan.threshold
    if plan.mode == "abs":
        return float(c)
    if plan.mode == "rel":
        return float(c * (r if r > plan.floor else plan.floor))
    k0, k1, k2, k3, k4 = coef
    t = k2 * ((k0 + k1 * r) + k3) * k4
    return float(c * (t if (t != t or t >= _TINY64) else _TINY64))


def _allclose(plan: CheckPlan, add: float, mult: float, finite: bool) -> tuple[float, float]:
    """``ToleranceEntry.allclose`` of the check's covariates (``finite``: all of them are)."""
    c = plan.threshold
    if not finite or plan.baseline:
        return math.nan, math.nan
    if plan.mode == "abs":
        return float(c), 0.0
    if plan.mode == "rel":
        return float(c * plan.floor), float(c)
    m = plan.model  # ScaleModel.allclose_pair, times the threshold
    return float(c * float(m.unit * (m.atol + add) * mult)), float(c * float(m.unit * m.rtol * mult))
