"""The result of one check: :class:`CheckResult`, its verdict and its message.

:meth:`CheckResult.of_entry` is the one place a check's verdict is formed from the decision
values (:mod:`tolstat.calibration.decision`), for the general path, the operator path and
the fused fast path of :mod:`tolstat.checks.checking`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from tolstat.calibration.bounds import exceedance_probability
from tolstat.calibration.decision import exceeds, ratio_value
from tolstat.models.statistics import get as get_statistic

__all__ = ["CheckResult"]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check of a kernel output against its reference.

    Attributes
    ----------
    passed : bool
        Every statistic is at or below its threshold.
    op, dtype, hardware : str
        The table group used (``hardware`` may be ``"*"``); ``fallback`` says how it
        was found.
    statistics : dict
        ``{name: value}`` of the check statistics.
    thresholds : dict
        ``{name: threshold}``.
    ratios : dict
        ``{name: value / threshold}`` (``inf`` for a positive value over a 0 threshold).
    probabilities : dict
        ``{name: estimated probability that a correct run reaches this value}``
        (estimated on first access when :meth:`of_entry` was not given them: the verdict
        does not need them).
    notes : dict
        ``{name: how the probability was estimated}`` (empirical, GPD tail beyond the
        data, ...; with ``probabilities``).
    failed : tuple of str
        Statistics over their threshold.
    worst_index : tuple of int
        Index of the element with the largest (normalised) error.
    worst_actual, worst_expected, worst_error, worst_allowed : float
        Its values, ``|d|`` and the largest ``|d|`` the max threshold allows there.
    n_elements, n_exceeding, n_nonfinite : int
        Elements compared, over their elementwise allowance, with NaN/Inf outputs.
    atol, rtol : float
        Allclose-form equivalent of the max threshold (NaN where there is none).
    fp_budget, confidence : float
        The table's promise for this check.
    methods : dict
        ``{name: calibration method}``.
    """

    passed: bool
    op: str
    dtype: str
    hardware: str
    fallback: str
    statistics: dict[str, float]
    thresholds: dict[str, float]
    ratios: dict[str, float]
    probabilities: dict[str, float]
    notes: dict[str, str]
    failed: tuple[str, ...]
    worst_index: tuple[int, ...]
    worst_actual: float
    worst_expected: float
    worst_error: float
    worst_allowed: float
    n_elements: int
    n_exceeding: int
    n_nonfinite: int
    atol: float
    rtol: float
    fp_budget: float
    confidence: float
    methods: dict[str, str] = field(default_factory=dict)
    n_calibration: int = 0
    guarantee: str = ""
    #: every element is the reference rounded to nearest: the output passes every threshold
    correctly_rounded: bool = False

    def __bool__(self) -> bool:
        return self.passed

    def message(self) -> str:
        """Human-readable explanation (the :func:`~tolstat.checks.checking.assert_close` message)."""
        return _message(self)

    def verdict_line(self) -> str:
        """One line in words: PASS or FAIL and why (``tolstat check`` prints it for a pass).

        A pass says how close each decision value came to its threshold; a statistic over
        its threshold in a passing check is named as not deciding (the combined score of
        an operator entry decides), and an output whose every element is the reference
        correctly rounded says so instead of comparing numbers.
        """
        head = f"{'PASS' if self.passed else 'FAIL'} {self.op}/{self.dtype}"
        if self.passed and self.correctly_rounded:
            return (f"{head}: every element is the reference rounded to {self.dtype} (correctly rounded), which "
                    "passes every threshold")
        parts = []
        for k, v in self.statistics.items():
            t, r = self.thresholds[k], self.ratios[k]
            if k in self.failed:
                parts.append(f"{k} {v:.4g} is above its threshold {t:.4g}"
                             + (" (not the deciding statistic)" if self.passed else ""))
            else:
                parts.append(f"{k} {v:.4g} is {100 * r:.1f}% of its threshold {t:.4g}")
        return f"{head}: " + "; ".join(parts)

    @classmethod
    def of_entry(cls, entry: Any, values: Mapping[str, float], thresholds: Mapping[str, float], *,
                 probabilities: Mapping[str, float] | None = None, notes: Mapping[str, str] | None = None,
                 decisive: str | None = None, covariates: Mapping[str, Any] | None = None,
                 **where: Any) -> "CheckResult":
        """The result of comparing decision ``values`` with their ``thresholds`` for a table entry.

        The one place where a check's verdict is formed: ``failed`` are the statistics
        whose value :func:`~tolstat.calibration.decision.exceeds` its threshold, ``ratios``
        (made on first access) are :func:`~tolstat.calibration.decision.ratio` (over 1
        exactly when failed),
        ``passed`` is that no statistic failed, or, with ``decisive``, that this one (the
        combined score of an operator entry) did not. The entry gives the group, the
        promise and the methods, and by default the probabilities
        (:func:`~tolstat.calibration.bounds.exceedance_probability`, estimated on first
        access of ``probabilities`` or ``notes``) and, from ``covariates``,
        the ``(atol, rtol)`` form of the max threshold (NaN where it has none); ``where``
        the worst element and the element counts.
        """
        values = {k: float(v) for k, v in values.items()}
        thresholds = {k: float(thresholds[k]) for k in values}
        failed = tuple(k for k, v in values.items() if exceeds(v, thresholds[k]))
        passed = decisive not in failed if decisive is not None else not failed
        methods = where.pop("methods", None) or {k: entry.statistics[k].method for k in values}
        lazy = probabilities is None
        if lazy:  # computed on first access (__getattr__): not needed for the verdict
            probabilities, notes = {}, {}
        if "atol" not in where:
            try:
                where["atol"], where["rtol"] = entry.allclose(covariates)
            except (ValueError, KeyError):
                where["atol"], where["rtol"] = math.nan, math.nan
        state = dict(passed=bool(passed), op=entry.op, dtype=entry.dtype, hardware=entry.hardware,
                     fallback=entry.fallback, statistics=values, thresholds=thresholds, failed=failed,
                     fp_budget=entry.fp_budget, confidence=entry.confidence, methods=methods,
                     n_calibration=entry.n, guarantee=str((entry.certificate or {}).get("guarantee", "")),
                     correctly_rounded=False)
        # ``where``: the worst element and the counts, the fields :meth:`__init__` would take
        if not where.keys() <= _WHERE_FIELDS:
            raise TypeError(f"of_entry() got unexpected fields {sorted(where.keys() - _WHERE_FIELDS)}")
        if not _WHERE_REQUIRED <= where.keys():
            raise TypeError(f"of_entry() is missing the fields {sorted(_WHERE_REQUIRED - where.keys())}")
        state.update(where)
        if not lazy:
            state["probabilities"], state["notes"] = dict(probabilities), dict(notes)
        else:
            state["_lazy"] = (values, {k: entry.statistics[k] for k in values})
        # the frozen dataclass's fields set directly (what its __init__ does one
        # object.__setattr__ at a time, a tenth of a small check's time); ``ratios`` is made
        # on first use from the values and thresholds (not needed for the verdict), and
        # ``probabilities`` and ``notes`` too where they were not given
        out = object.__new__(cls)
        out.__dict__.update(state)
        return out

    def __getattr__(self, name: str) -> Any:
        # only reached for an attribute not set: ``ratios`` of a result made by of_entry
        # (the ratio of each value to its threshold, made on first use), and
        # ``probabilities`` and ``notes`` of one made without them, estimated from the
        # entry's calibrations on first use
        if name == "ratios":
            state = self.__dict__
            if "statistics" not in state or "thresholds" not in state:
                raise AttributeError(name)
            th = state["thresholds"]
            state["ratios"] = {k: ratio_value(v, th[k]) for k, v in state["statistics"].items()}
            return state["ratios"]
        if name not in ("probabilities", "notes"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        state = self.__dict__
        lazy = state.get("_lazy")
        if lazy is None:
            raise AttributeError(name)
        values, cals = lazy
        found = {k: exceedance_probability(v, cals[k]) for k, v in values.items()}
        state["notes"] = {k: e.note for k, e in found.items()}
        state["probabilities"] = {k: e.probability for k, e in found.items()}
        return state[name]


#: the fields of :class:`CheckResult` that :meth:`CheckResult.of_entry` takes from ``where``
#: (the worst element and the counts; ``correctly_rounded`` defaults to False)
_WHERE_REQUIRED = frozenset({"worst_index", "worst_actual", "worst_expected", "worst_error", "worst_allowed",
                             "n_elements", "n_exceeding", "n_nonfinite", "atol", "rtol"})
_WHERE_FIELDS = _WHERE_REQUIRED | {"correctly_rounded"}


def _describe(name: str) -> str:
    try:
        return get_statistic(name).description
    except ValueError:
        return name


def _fmt_p(p: float) -> str:
    if p == 0:
        return "0"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


#: plain words for the operator-noise statistics (:data:`tolstat.measure.noise.STATISTICS`)
_OP_WORDS = {
    "op_max": "the largest error", "op_rms": "the RMS error", "op_mean": "the mean error",
    "op_bias": "a systematic shift (mean signed error)",
    "op_sbias": "a systematic shift toward or away from zero",
    "op_frac": "the share of elements far beyond the noise", "op_row_rms_max": "the RMS error of one row",
    "op_row_rms_mean": "the RMS error of the rows", "op_row_bias_max": "the sum of one row",
}


#: plain words for the per-run statistics of the scale forms and ``form=None``
_WORDS = {
    "max_abs": "the largest error |actual - expected|",
    "max_ulp": "the largest error in ULPs of the output format",
    "max_rel": "the largest relative error",
    "max_score": "the largest error measured against its allowance atol + rtol*|expected|",
    "bias": "a systematic shift (mean signed error against the mean error)",
}


def _op_words(name: str) -> str:
    base = name.removesuffix("_mid")
    if base.startswith("inv_"):
        return f"the invariant {base[4:]} of the op"
    return _OP_WORDS.get(base, name)


def _elements_line(r: CheckResult) -> str:
    """How many elements exceed their allowance, never in contradiction with the verdict."""
    if r.correctly_rounded:
        return ("  the output is correctly rounded (every element is the reference rounded to nearest): "
                "it passes every threshold")
    nf = f"; {r.n_nonfinite} non-finite outputs" if r.n_nonfinite else ""
    if not r.passed and r.n_exceeding == 0:
        return (f"  no single element exceeds its allowance: the error lies in the output as a whole (all "
                f"{r.n_elements} elements together){nf}")
    if r.passed and r.n_exceeding:
        return (f"  {r.n_exceeding} of {r.n_elements} elements exceed their own allowance, which the threshold "
                f"of the whole output tolerates{nf}")
    return f"  {r.n_exceeding} of {r.n_elements} elements exceed their allowance{nf}"


def _promise_line(r: CheckResult) -> str:
    if "exact" in r.methods.values():
        return (f"  promise: none at budget {r.fp_budget:g} (an exact group: any error above a correctly rounded "
                "output fails; its certificate bounds how often a correct run does)")
    if "model_tail" in r.methods.values():
        return (f"  promise (model-based, not distribution-free): a correct kernel fails this check with probability "
                f"<= {r.fp_budget:g} if the score's tail below the budget the {r.n_calibration} calibration runs "
                "support is no heavier than a normal one (the table's reason says so)")
    if "evt" in r.methods.values():
        return (f"  promise (model-based, no finite-sample guarantee): a correct kernel fails this check with "
                f"probability <= {r.fp_budget:g} if the generalized Pareto tail fitted to the {r.n_calibration} "
                "calibration runs holds")
    if "conformal" in r.methods.values():
        return (f"  promise: a correct kernel fails this check with probability <= {r.fp_budget:g}, averaged over "
                "calibration sets (split conformal, no confidence level)")
    return (f"  promise: a correct kernel fails this check with probability <= {r.fp_budget:g} (confidence "
            f"{r.confidence:g}; {r.methods.get('op_score', r.methods.get(next(iter(r.methods), ''), '?'))} of "
            f"{r.n_calibration} calibration runs)")


def _operator_message(r: CheckResult, head: str, hw: str) -> str:
    """The operator form's message: what is wrong in words, in at most about eight lines."""
    lines = [f"tolstat check {head}: op={r.op!r}, dtype={r.dtype!r}, hardware={hw}"]
    parts = sorted(((v, k) for k, v in r.ratios.items() if k != "op_score" and math.isfinite(v)), reverse=True)
    beyond = [(v, k) for v, k in parts if k in r.failed]
    if beyond:
        v, k = beyond[0]
        lines.append(f"  what is wrong: {_op_words(k)} is {v:.3g}x what correct runs reach ({k})")
        words: dict[str, float] = {}  # the largest ratio per description (both noise shapes read alike)
        for v2, k2 in beyond[1:]:
            if _op_words(k2) != _op_words(k):
                words.setdefault(_op_words(k2), v2)
        rest = [f"{w} {v2:.3g}x" for w, v2 in list(words.items())[:3]]
        if rest:
            lines.append("  also beyond: " + ", ".join(rest))
    elif parts:
        v, k = parts[0]
        lines.append(f"  closest to its limit: {_op_words(k)} at {v:.3g}x what correct runs reach ({k})")
    sc = r.statistics.get("op_score", math.nan)
    lines.append(f"  combined score {sc:.4g} vs threshold {r.thresholds.get('op_score', math.nan):.4g} "
                 "(0 when correctly rounded)")
    idx = ", ".join(map(str, r.worst_index))
    allowed = "" if not math.isfinite(r.worst_allowed) else f", allowed {r.worst_allowed:.4g}"
    lines.append(f"  worst element at index ({idx}): actual={r.worst_actual!r}, expected={r.worst_expected!r} "
                 f"(|d|={r.worst_error:.4g}{allowed})")
    lines.append(_elements_line(r))
    lines.append(_promise_line(r))
    return "\n".join(lines)


def _zero_run_message(r: CheckResult, head: str) -> str:
    """A check decided by the zero-run model (no table group): what it compared and that
    the threshold is model-based."""
    ratio = r.statistics["zero_run"]
    idx = ", ".join(map(str, r.worst_index))
    return "\n".join([
        f"tolstat check {head}: op={r.op!r}, dtype={r.dtype!r}: no table group, decided by the model-based "
        "threshold from zero runs",
        f"  worst element at index ({idx}): actual={r.worst_actual!r}, expected={r.worst_expected!r} "
        f"(|d|={r.worst_error:.4g}, allowed {r.worst_allowed:.4g}): {ratio:.3g}x its allowance",
        _elements_line(r),
        f"  allowance per element at budget {r.fp_budget:g} for the whole output: {r.guarantee}",
        "  calibrate this group (collect correct runs, tolstat.select) to replace the model with a certified "
        "threshold",
    ])


def _message(r: CheckResult) -> str:
    hw = r.hardware if r.fallback == "exact" else f"{r.hardware} ({r.fallback})"
    head = "passed" if r.passed else "FAILED"
    if "model_zero_run" in r.methods.values():
        return _zero_run_message(r, head)
    if "op_score" in r.statistics:
        return _operator_message(r, head, hw)
    lines = [f"tolstat check {head}: op={r.op!r}, dtype={r.dtype!r}, hardware={hw}"]
    if r.failed:
        k = max(r.failed, key=lambda n: r.ratios[n])
        lines.append(f"  what is wrong: {_WORDS.get(k, _describe(k))} is {r.ratios[k]:.3g}x what the threshold "
                     "allows")
    for k, v in r.statistics.items():
        mark = "FAIL" if k in r.failed else "ok"
        lines.append(
            f"  [{mark}] {k} = {v:.6g} vs threshold {r.thresholds[k]:.6g} ({r.ratios[k]:.3g}x the threshold; "
            f"{_describe(k)})"
        )
    if math.isfinite(r.atol):
        lines.append(f"  allowed per element: |actual - expected| <= atol + rtol*|expected| with "
                     f"atol={r.atol:.4g}, rtol={r.rtol:.4g}")
    idx = ", ".join(map(str, r.worst_index))
    allowed = "" if not math.isfinite(r.worst_allowed) else f", allowed {r.worst_allowed:.4g}"
    lines.append(f"  worst element at index ({idx}): actual={r.worst_actual!r}, expected={r.worst_expected!r} "
                 f"(|d|={r.worst_error:.4g}{allowed})")
    lines.append(_elements_line(r))
    noted = set()
    for k in (r.failed or tuple(r.statistics)[:1]):
        if math.isnan(r.probabilities[k]):
            if r.notes[k] not in noted:
                lines.append(f"  {r.notes[k]}")
            noted.add(r.notes[k])
            continue
        lines.append(f"  probability that a correct kernel gives a {k} this large: ~{_fmt_p(r.probabilities[k])} "
                     f"({r.notes[k]})")
    # the promise in one line (the threshold's full guarantee is the result's ``guarantee``)
    lines.append(_promise_line(r))
    return "\n".join(lines)
