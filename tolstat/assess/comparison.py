"""Cross-validated comparison of tolerance methods on the user's own error tables.

``tolstat.compare(errors)`` answers, for an error dataset of *correct* runs (and
optionally a set of known-bad runs): which tolerance method, at which false-positive
budget, keeps its promise on this data, how tight is it, how stable across resamples,
and how many bad runs does it catch?

Protocol
--------
1. **Folds.** The correct runs are split into ``folds`` folds, deterministically from
   ``seed``. With ``cluster="case"`` the unit of the split is a value of that label, so
   all runs of one case (e.g. several kernel variants run on the same inputs) land in
   the same fold. Buggy runs are assigned to folds the same way (by their cluster label
   when they have it, else run by run) and each is scored once, in its fold.
2. **Calibrate on train, score on test.** For each method, budget and fold, the method
   is calibrated on the other folds (:meth:`Rule.fit`), then every held-out run gets its
   check statistic as a fraction of the threshold of its group (``ratio``; the check
   fails when ``ratio > 1``). The statistic is recomputed from the dataset's per-run
   variables exactly as the table defines it (each statistic's
   ``tolstat.models.statistics.Statistic.run_scores``, the function :func:`tolstat.select`
   calibrates on); normalised statistics are exact because the element sample keeps each run's
   Pareto front (``docs/schema.md``). No kernel is re-run.
3. **Measures** per method x group x budget x fold: threshold, held-out false positives
   ``fp / n_test`` with an exact Clopper-Pearson interval at ``confidence``
   (``scipy.stats.binomtest(...).proportion_ci(method="exact")``), tightness (median
   held-out ratio), recall on the buggy runs of the fold. Pooled over folds: the same
   counts summed, the stability of the threshold (max / min over folds), and a verdict.
4. **Verdict.** The promise of a budgeted method is ``P(check of a correct run fails) <=
   budget``. From the pooled held-out counts and the two-sided Clopper-Pearson interval
   at ``confidence``: ``"held"`` when the interval's upper end is ``<= budget`` (the
   data show the rate is within budget), ``"broken"`` when its lower end is ``>
   budget`` (the data show it is above), else ``"consistent"`` (the data do not refute
   the promise but are too few to show it: a method whose rate sits just under its
   budget lands here, and budget ``1e-3`` needs thousands of held-out runs to show
   anything). Static rules make no promise; their verdict only says whether their
   realised rate meets the budget.
   Pooled over folds the rate is that of a threshold calibrated on ``(folds-1)/folds``
   of the runs, averaged over calibration sets.

Methods are :class:`Rule` objects, built from names (:data:`METHODS`) or dicts by
:func:`make_rule`. The per-fold core, :func:`calibrate_and_score`, is what
``tolstat evaluate`` can call on its corpus (one calibration set, one test set).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr
from scipy import stats as _st

from tolstat._version import __version__
from tolstat.dataset.schema import FINGERPRINT, concat, run_units, validate
from tolstat.models.scale import ScaleModel, run_scores
from tolstat._base.inference import budget_verdict, clopper_pearson
from tolstat.calibration.decision import entry_run_values, exceeds
from tolstat._base.util import ANY
from tolstat.calibration.selection import select

__all__ = [
    "METHODS",
    "DEFAULT_METHODS",
    "TORCH_DEFAULTS",
    "Rule",
    "Fitted",
    "StaticRule",
    "StudyRule",
    "SelectRule",
    "make_rule",
    "FoldOutcome",
    "calibrate_and_score",
    "assign_folds",
    "CompareResult",
    "compare",
]

#: ``torch.testing.assert_close`` defaults ``(rtol, atol)`` per dtype
TORCH_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}

_SELECT_RESERVED = ("fp_budget", "confidence", "by", "on_error", "errors_or_fit")


# --------------------------------------------------------------------------- rules
@dataclass
class Fitted:
    """A rule calibrated on one training set.

    Attributes
    ----------
    thresholds : dict
        ``{(op, dtype, hardware): threshold}`` of the rule's primary (max-error)
        statistic, in that statistic's units (1.0 for static allclose rules, whose
        statistic is the allclose ratio).
    reasons : dict
        ``{group: why}`` for groups that could not be calibrated (threshold NaN).
    score : callable
        ``score(ds) -> ndarray``: per-run check statistic / threshold of a dataset's
        runs (fails when > 1); NaN for runs of groups without a threshold.
    table : ToleranceTable or None
        The table of a :class:`SelectRule` (what :func:`tolstat.check` would use).
    """

    thresholds: dict[tuple[str, str, str], float]
    reasons: dict[tuple[str, str, str], str]
    score: Any
    table: Any = None


class Rule:
    """A tolerance method: calibrate on correct runs (:meth:`fit`), then score runs.

    Attributes
    ----------
    name : str
        Label in tables.
    family : {"static", "study", "tolstat"}
    budgeted : bool
        Whether the rule makes a false-positive promise (uses the budget).
    data_free : bool
        Whether the rule ignores the calibration data (its scores are computed once).
    unit : str
        The statistic that :attr:`Fitted.thresholds` are thresholds of (``"max_abs"``:
        absolute error, comparable across rules).
    """

    name: str = "rule"
    family: str = "static"
    budgeted: bool = False
    data_free: bool = False
    unit: str = "allclose ratio"

    def fit(self, train: xr.Dataset | None, *, budget: float, confidence: float,
            by: Sequence[str]) -> Fitted:
        """Calibrate on ``train`` (an error dataset of correct runs).

        Raises
        ------
        ValueError
            The rule cannot be calibrated at all on ``train``.
        """
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the rule."""
        return self.name

    def describe_at(self, budget: float, confidence: float) -> str:
        """One line: the rule as calibrated at ``budget`` and ``confidence``."""
        return self.describe()


def _keys(ds: xr.Dataset, by: Sequence[str]) -> np.ndarray:
    """Group key of each run: ``op/dtype/hardware`` with ``*`` for labels not in ``by``."""
    cols = [np.asarray(ds[n].values).astype(str) if n in by else np.full(ds.sizes["run"], ANY)
            for n in ("op", "dtype", "hardware")]
    return np.array(["/".join(t) for t in zip(*cols)]) if ds.sizes["run"] else np.empty(0, dtype=str)


def _split_key(k: str) -> tuple[str, str, str]:
    op, dt, hw = k.split("/", 2)
    return op, dt, hw


def _ratio(x: np.ndarray, thr: float) -> np.ndarray:
    """``x / thr`` with ``0/0 = 0`` (a zero threshold passes only exact results), such that
    ``ratio > 1`` exactly when the check's comparison (:func:`tolstat.calibration.decision.exceeds`) fails."""
    x = np.asarray(x, dtype=np.float64)
    if thr == 0.0:
        return np.where(x > 0, np.inf, np.where(np.isnan(x), np.nan, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = x / thr
    over = exceeds(x, thr)
    return np.where(over, np.maximum(r, np.nextafter(1.0, 2.0)), np.where(np.isnan(x), np.nan, np.minimum(r, 1.0)))


def _per_block(ds: xr.Dataset, fn: Any, sample_vars: Sequence[str]) -> np.ndarray:
    """``fn`` over contiguous blocks of runs, each block's ``sample_vars`` read once.

    In-memory data (or no sample variables needed): one call on the whole dataset.
    Dask-backed data: one block per chunk of ``sample_abs`` along ``run``, so every
    stored chunk is read once, however the runs are grouped.
    """
    chunks = ds["sample_abs"].chunks if sample_vars else None
    if chunks is None:
        return fn(ds)
    out = np.empty(ds.sizes["run"], dtype=np.float64)
    start = 0
    for size in chunks[0]:
        sl = slice(start, start + size)
        blk = ds.isel(run=sl)
        blk = blk.assign({v: blk[v].load() for v in sample_vars})
        out[sl] = fn(blk)
        start += size
    return out


class StaticRule(Rule):
    """``|d| <= atol + rtol*|ref|`` element-wise with one (rtol, atol) per dtype.

    The run statistic is ``max_i |d_i| / (atol + rtol*|ref_i|)`` (threshold 1), computed
    with :func:`tolstat.models.scale.run_scores` and an allclose :class:`tolstat.ScaleModel`.
    """

    family = "static"
    data_free = True

    def __init__(self, name: str, tolerances: Mapping[str, tuple[float, float]]):
        self.name = name
        self.tolerances = {str(k): (float(r), float(a)) for k, (r, a) in dict(tolerances).items()}
        for dt, (r, a) in self.tolerances.items():
            if not (r >= 0 and a >= 0 and r + a > 0 and math.isfinite(r + a)):
                raise ValueError(f"{name}: rtol/atol for {dt} must be finite, >= 0 and not both 0, got "
                                 f"rtol={r!r}, atol={a!r}")

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        def score_block(ds: xr.Dataset) -> np.ndarray:
            out = np.full(ds.sizes["run"], np.nan)
            dts = np.asarray(ds["dtype"].values).astype(str)
            for dt in np.unique(dts):
                if dt not in self.tolerances:
                    continue
                r, a = self.tolerances[dt]
                idx = np.flatnonzero(dts == dt)
                sub = ds.isel(run=idx) if idx.size != dts.size else ds
                out[idx] = run_scores(sub, ScaleModel("allclose", atol=a, rtol=r)).scores
            return out

        def score(ds: xr.Dataset) -> np.ndarray:
            return _per_block(ds, score_block, ("sample_abs", "sample_ref"))

        return Fitted({}, {}, score)

    def threshold(self, key: tuple[str, str, str]) -> float:
        """1.0 where the dtype has tolerances, else NaN."""
        return 1.0 if key[1] in self.tolerances else math.nan

    def describe(self) -> str:  # noqa: D102
        return "allclose " + "; ".join(f"{d}: rtol={r:g} atol={a:g}" for d, (r, a) in self.tolerances.items())


class StudyRule(Rule):
    """``atol = factor * p<percentile>(max_abs)`` of the calibration runs, per group.

    The 2026 study's rule is ``factor=1.5, percentile=95``; ``factor=1`` gives the bare
    sample percentile (a ``1 - percentile/100`` false-positive method, no confidence).
    """

    family = "study"
    unit = "max_abs"

    def __init__(self, name: str = "study p95x1.5", factor: float = 1.5, percentile: float = 95.0):
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"factor must be a positive number, got {factor!r}")
        if not (0 < percentile <= 100):
            raise ValueError(f"percentile must lie in (0, 100], got {percentile!r}")
        self.name, self.factor, self.percentile = name, float(factor), float(percentile)

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        keys = _keys(train, by)
        mx = np.asarray(train["max_abs"].values, dtype=np.float64)
        thr: dict[tuple[str, str, str], float] = {}
        reasons: dict[tuple[str, str, str], str] = {}
        for k in np.unique(keys):
            x = mx[keys == k]
            x = x[np.isfinite(x)]
            if x.size == 0:
                thr[_split_key(k)] = math.nan
                reasons[_split_key(k)] = "no finite calibration runs"
            else:
                thr[_split_key(k)] = self.factor * float(np.percentile(x, self.percentile))

        def score(ds: xr.Dataset) -> np.ndarray:
            kk = _keys(ds, by)
            x = np.asarray(ds["max_abs"].values, dtype=np.float64)
            out = np.full(x.size, np.nan)
            for k in np.unique(kk):
                t = thr.get(_split_key(k), math.nan)
                if not math.isnan(t):
                    m = kk == k
                    out[m] = _ratio(x[m], t)
            return out

        return Fitted(thr, reasons, score)

    def describe(self) -> str:  # noqa: D102
        return f"atol = {self.factor:g} x p{self.percentile:g}(run max_abs) per group"


class SelectRule(Rule):
    """``tolstat.select(train, fp_budget=budget, confidence=confidence, by=by, **options)``.

    Held-out runs are scored from the dataset exactly as the table defines the check:
    every statistic of the entry (its registered ``Statistic.run_scores`` with the
    entry's scale model, as ``select`` calibrated it) over its threshold, the largest of
    them being the run's ratio. Groups ``select`` refuses (too few runs for the budget)
    are kept with the reason (``on_error="skip"``).
    """

    family = "tolstat"
    budgeted = True

    def __init__(self, name: str, **options: Any):
        bad = [k for k in options if k in _SELECT_RESERVED]
        if bad:
            raise ValueError(f"method {name!r}: {bad} are set by compare itself (budgets=, confidence=, by=)")
        # select's own defaults unless given: held-out runs are scored with the decision values
        # of tolstat.calibration.decision, the numbers tolstat.check compares, for every form
        self.name, self.options = name, dict(options)

    @property
    def unit(self) -> str:  # type: ignore[override]
        """``max_score`` with a noise-scale form, else the first max-error statistic."""
        if self.options.get("form", "auto") in ("auto", "operator"):
            return "op_score or max_score (the default form)"
        if self.options.get("form") is not None:
            return "max_score"
        stat = self.options.get("statistic", "max_abs")
        return next(s for s in ([stat] if isinstance(stat, str) else list(stat)) if s != "bias")

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        table = select(train, fp_budget=budget, confidence=confidence, by=tuple(by), on_error="skip",
                       **self.options)
        d = table.data
        thr: dict[tuple[str, str, str], float] = {}
        reasons: dict[tuple[str, str, str], str] = {}
        for i, key in enumerate(table.groups):
            row = np.asarray(d["threshold"].values[i], dtype=np.float64)
            refused = np.flatnonzero(np.isnan(row))
            # a group with any statistic refused (e.g. bias at a small budget) cannot be checked
            thr[key] = math.nan if refused.size else float(row[0])
            if refused.size:
                reasons[key] = str(d["reason"].values[i, refused[0]])

        def score(ds: xr.Dataset) -> np.ndarray:
            need = ("sample_abs", "sample_ref") if self.options.get("form", "auto") is not None else ()
            return _per_block(ds, score_block, need)

        def score_block(ds: xr.Dataset) -> np.ndarray:
            kk = _keys(ds, by)
            out = np.full(ds.sizes["run"], np.nan)
            for k in np.unique(kk):
                key = _split_key(k)
                if key not in thr or math.isnan(thr[key]):
                    continue
                ent = table.entry(*key)
                idx = np.flatnonzero(kk == k)
                sub = ds.isel(run=idx) if idx.size != kk.size else ds
                r = np.zeros(idx.size)
                # the decision values check compares (tolstat.calibration.decision), as select certified them
                for name, x in entry_run_values(sub, ent).items():
                    r = np.maximum(r, _ratio(x, ent.statistics[name].threshold))
                out[idx] = r
            return out

        return Fitted(thr, reasons, score, table)

    def describe(self) -> str:  # noqa: D102
        return self._text("B", "C")

    def describe_at(self, budget: float, confidence: float) -> str:  # noqa: D102
        return self._text(f"{budget:g}", f"{confidence:g}")

    def _text(self, budget: str, confidence: str) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"tolstat.select(fp_budget={budget}, confidence={confidence}{', ' + opts if opts else ''})"


#: named methods (``methods=`` accepts these names, dicts and :class:`Rule` objects)
METHODS: dict[str, Any] = {
    "torch-defaults": lambda: StaticRule("torch-defaults", TORCH_DEFAULTS),
    "atol=rtol=1e-2": lambda: StaticRule("atol=rtol=1e-2", {d: (1e-2, 1e-2) for d in TORCH_DEFAULTS}),
    "study": lambda: StudyRule("study"),
    "tolstat": lambda: SelectRule("tolstat"),
    "tolstat-max_abs": lambda: SelectRule("tolstat-max_abs", form=None, statistic="max_abs"),
    "tolstat-max_ulp": lambda: SelectRule("tolstat-max_ulp", form=None, statistic="max_ulp"),
    "tolstat-allclose": lambda: SelectRule("tolstat-allclose", form="allclose"),
    "tolstat-size_aware": lambda: SelectRule("tolstat-size_aware", form="size_aware"),
    "tolstat-max_abs+bias": lambda: SelectRule("tolstat-max_abs+bias", form=None, statistic=("max_abs", "bias")),
}
#: methods compared by default
DEFAULT_METHODS = ("torch-defaults", "atol=rtol=1e-2", "study", "tolstat", "tolstat-allclose",
                   "tolstat-size_aware")


def make_rule(spec: str | Mapping[str, Any] | Rule) -> Rule:
    """A :class:`Rule` from a name in :data:`METHODS`, a dict, or a Rule.

    Dicts: ``{"name": ..., "atol": a, "rtol": r}`` (static, every dtype),
    ``{"name": ..., "rule": "study", "factor": f, "percentile": p}``, or
    ``{"name": ..., **select_kwargs}`` (e.g. ``{"form": "allclose"}``; ``name``
    defaults to a label built from the kwargs).

    Raises
    ------
    ValueError
        Unknown name, or a dict mixing kinds.
    """
    if isinstance(spec, Rule):
        return spec
    if isinstance(spec, str):
        if spec not in METHODS:
            raise ValueError(f"unknown method {spec!r}; known: {sorted(METHODS)} (or a dict of select kwargs)")
        return METHODS[spec]()
    if not isinstance(spec, Mapping):
        raise TypeError(f"a method must be a name, a dict or a Rule, got {type(spec).__name__}")
    d = dict(spec)
    name = d.pop("name", None)
    if "atol" in d or "rtol" in d:
        extra = set(d) - {"atol", "rtol"}
        if extra:
            raise ValueError(f"static method {name or spec!r}: unexpected keys {sorted(extra)}")
        a, r = float(d.get("atol", 0.0)), float(d.get("rtol", 0.0))
        return StaticRule(name or f"atol={a:g},rtol={r:g}", {dt: (r, a) for dt in TORCH_DEFAULTS})
    if d.get("rule") == "study":
        d.pop("rule")
        extra = set(d) - {"factor", "percentile"}
        if extra:
            raise ValueError(f"study method {name or spec!r}: unexpected keys {sorted(extra)}")
        f, p = float(d.get("factor", 1.5)), float(d.get("percentile", 95.0))
        return StudyRule(name or f"study p{p:g}x{f:g}", f, p)
    if "rule" in d:
        raise ValueError(f"unknown rule {d['rule']!r} in method {spec!r} (only 'study')")
    label = name or ("tolstat(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")")
    return SelectRule(label, **d)


# --------------------------------------------------------------------------- core
@dataclass
class FoldOutcome:
    """One rule calibrated on one training set and scored on held-out runs.

    Attributes
    ----------
    thresholds, reasons : dict
        Per group (see :class:`Fitted`); ``reasons`` names groups without a threshold.
    ratios : ndarray
        Held-out correct runs: statistic / threshold (NaN: group not calibrated).
    buggy_ratios : ndarray
        The same for the buggy runs given (empty if none).
    error : str
        Non-empty when the rule could not be calibrated at all (then all NaN).
    """

    thresholds: dict[tuple[str, str, str], float]
    reasons: dict[tuple[str, str, str], str]
    ratios: np.ndarray
    buggy_ratios: np.ndarray
    error: str = ""


def calibrate_and_score(rule: Rule, train: xr.Dataset | None, test: xr.Dataset,
                        buggy: xr.Dataset | None = None, *, budget: float, confidence: float = 0.95,
                        by: Sequence[str] = ("op", "dtype", "hardware")) -> FoldOutcome:
    """Calibrate ``rule`` on ``train``, score ``test`` (and ``buggy``) runs: the per-fold core.

    Parameters
    ----------
    rule : Rule
    train : xarray.Dataset or None
        Error dataset of correct calibration runs (None only for data-free rules).
    test : xarray.Dataset
        Held-out correct runs.
    buggy : xarray.Dataset, optional
        Known-bad runs.
    budget, confidence : float
        The promise the rule is calibrated for (ignored by static rules).
    by : sequence of str
        Grouping of thresholds.

    Returns
    -------
    FoldOutcome
        A rule that raises ``ValueError`` while calibrating is recorded with its
        message in ``error``, never raised.
    """
    nb = 0 if buggy is None else buggy.sizes["run"]
    try:
        fitted = rule.fit(train, budget=budget, confidence=confidence, by=by)
    except ValueError as exc:
        return FoldOutcome({}, {}, np.full(test.sizes["run"], np.nan), np.full(nb, np.nan), str(exc) or "refused")
    r = fitted.score(test) if test.sizes["run"] else np.empty(0)
    b = fitted.score(buggy) if nb else np.empty(0)
    return FoldOutcome(fitted.thresholds, fitted.reasons, r, b)


def assign_folds(units: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold (0 .. folds-1) of each run from its unit label, deterministic in ``seed``.

    The distinct unit values are shuffled with ``numpy.random.default_rng(seed)`` and
    dealt round-robin, so every run of one unit gets the same fold and fold sizes (in
    units) differ by at most one.
    """
    u, inv = np.unique(np.asarray(units).astype(str), return_inverse=True)
    perm = np.random.default_rng(seed).permutation(u.size)
    fold_of = np.empty(u.size, dtype=np.int64)
    fold_of[perm] = np.arange(u.size) % folds
    return fold_of[inv.ravel()]


# --------------------------------------------------------------------------- result
@dataclass
class CompareResult:
    """Outcome of :func:`compare`.

    Attributes
    ----------
    data : xarray.Dataset
        Dims ``method x group x budget x fold`` (per-fold variables) and ``method x
        group x budget`` (pooled over folds, prefixed ``pooled_``); see
        ``docs/compare.md`` for every variable.
    rows : list of dict
        Tidy summary, one row per (method, budget), pooled over groups and folds.
    group_rows : list of dict
        One row per (method, group, budget), pooled over folds.
    settings : dict
        The arguments of the run.
    run_fold, buggy_fold : numpy.ndarray
        The fold of each correct run (in the order of the correct runs of ``errors``)
        and of each buggy run.
    """

    data: xr.Dataset
    rows: list[dict[str, Any]]
    group_rows: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    run_fold: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    buggy_fold: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def summary(self, per_group: bool = False) -> str:
        """The comparison as a text table (one line per method and budget, or per group too)."""
        src = self.group_rows if per_group else self.rows
        head = ["method", *(["group"] if per_group else []), "budget", "scored", "FP", "FP rate",
                f"{100 * self.settings.get('confidence', 0.95):g}% CI", "verdict", "tightness", "stability",
                "recall"]
        out = [head]
        for r in src:
            ci = "-" if math.isnan(r["fp_hi"]) else f"[{100 * r['fp_lo']:.2f}, {100 * r['fp_hi']:.2f}]%"
            out.append([
                r["method"], *([r["group"]] if per_group else []), f"{r['budget']:g}",
                "-" if not r["n_runs"] else f"{100 * r['n_test'] / r['n_runs']:.0f}%",
                f"{r['fp']}/{r['n_test']}",
                "-" if math.isnan(r["fp_rate"]) else f"{100 * r['fp_rate']:.2f}%", ci,
                r["verdict"] + ("" if r["budgeted"] else "*"),
                "-" if math.isnan(r["tightness"]) else f"{r['tightness']:.3f}",
                "-" if math.isnan(r["stability"]) else f"{r['stability']:.3f}",
                "-" if r["n_buggy"] == 0 else f"{r['caught']}/{r['n_buggy']} ({100 * r['recall']:.1f}%)",
            ])
        w = [max(len(row[i]) for row in out) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w[i]) if i < (2 if per_group else 1) else c.rjust(w[i])
                           for i, c in enumerate(row)) for row in out]
        lines.insert(1, "-" * len(lines[0]))
        notes = [("scored: share of the correct runs held out in a fold where the method had a threshold "
                  "for their group"),
                 "* static rule: makes no promise; the verdict says whether its realised rate meets the budget"]
        refused = [r for r in self.group_rows if r["refused_folds"]]
        for r in refused[:8]:
            why = re.sub(r"^group \(.*?\) statistic \w+: ", "", r["reason"])
            why = why.replace(" (n >= ln(1-confidence)/ln(1-budget))", "")
            notes.append(f"! {r['method']} {r['group']} @ {r['budget']:g}: {r['refused_folds']} of "
                         f"{self.settings.get('folds', '?')} folds not calibrated: {why}")
        if len(refused) > 8:
            notes.append(f"! ... {len(refused) - 8} more (group_rows / the 'reason' variable)")
        return "\n".join(lines + notes)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: settings, summary rows, per-group rows."""
        return {"tolstat_version": __version__, "settings": self.settings, "summary": self.rows,
                "groups": self.group_rows}

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (atomically; NaN written as null)."""
        text = json.dumps(_nan_to_none(self.to_dict()), indent=1, default=_json_default) + "\n"
        return _atomic(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def to_netcdf(self, path: str | os.PathLike[str]) -> Path:
        """Write :attr:`data` to netCDF-4 (h5netcdf, atomically)."""
        return _atomic(Path(path), lambda tmp: self.data.to_netcdf(tmp, engine="h5netcdf"))

    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """``compare.json``, ``compare.nc`` and ``summary.txt`` (each atomically); the plots are
        :func:`tolstat.cli.plots.plot_compare`'s."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        text = self.summary() + "\n\n" + self.summary(per_group=True) + "\n"
        written = [self.to_json(out / "compare.json"), self.to_netcdf(out / "compare.nc"),
                   _atomic(out / "summary.txt", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))]
        return written


def _atomic(dest: Path, write: Any) -> Path:
    """The package's one atomic writer (unique temporary, one rename, stale cleanup)."""
    from tolstat._base.util import atomic_write

    return atomic_write(dest, write)


def _nan_to_none(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _nan_to_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_to_none(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return _nan_to_none(float(o))
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(type(o).__name__)


# --------------------------------------------------------------------------- compare
def _run_level_in_memory(ds: xr.Dataset) -> xr.Dataset:
    """Load the run-level variables and labels of a (possibly dask-backed) dataset; samples stay lazy."""
    names = [n for n, v in ds.variables.items() if v.dims == ("run",) and getattr(v, "chunks", None)]
    if not names:
        return ds
    import dask

    loaded = dict(zip(names, dask.compute(*(ds[n] for n in names))))
    out = ds.copy()
    for n, v in loaded.items():
        if n in out.coords:
            out = out.assign_coords({n: v})
        else:
            out[n] = v
    return out


def _label(ds: xr.Dataset, name: str, what: str) -> np.ndarray:
    if name not in ds.variables or ds[name].dims != ("run",):
        raise ValueError(f"{what}={name!r} is not a label along 'run' of the dataset "
                         f"(labels: {[n for n, v in ds.variables.items() if v.dims == ('run',)][:20]})")
    return np.asarray(ds[name].values).astype(str)


def _unit_float(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {v!r}") from None
    if not 0.0 < f < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {v!r}")
    return f


def compare(
    errors: xr.Dataset,
    *,
    methods: Sequence[str | Mapping[str, Any] | Rule] = DEFAULT_METHODS,
    budgets: Sequence[float] = (1e-2, 1e-3),
    folds: int = 5,
    buggy: xr.Dataset | None = None,
    by: Sequence[str] = ("op", "dtype", "hardware"),
    cluster: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    progress: bool | None = None,
) -> CompareResult:
    """Cross-validated comparison of tolerance methods on an error dataset.

    Parameters
    ----------
    errors : xarray.Dataset
        Error dataset (``docs/schema.md``), in memory or dask-backed. Runs with the
        label ``kind == "buggy"`` (if the dataset has a ``kind`` label) are taken as
        buggy runs; all others must be correct runs.
    methods : sequence
        Names in :data:`METHODS`, dicts (:func:`make_rule`) or :class:`Rule` objects.
    budgets : sequence of float
        False-positive budgets per check, each in (0, 1).
    folds : int, default 5
        Number of cross-validation folds (>= 2).
    buggy : xarray.Dataset, optional
        Known-bad runs (same schema); recall is reported when there are any.
    by : sequence of str, default ("op", "dtype", "hardware")
        Groups of thresholds (must contain ``op`` and ``dtype``).
    cluster : str, optional
        Label whose runs must stay in one fold (e.g. ``"case"``). Default: each run is
        its own unit.
    confidence : float, default 0.95
        Confidence of the tolstat thresholds and level of the two-sided Clopper-Pearson
        intervals of the realised false-positive rate.
    seed : int, default 0
        Seed of the fold assignment.
    progress : bool, optional
        tqdm progress bar (default: only on a terminal).

    Returns
    -------
    CompareResult

    Raises
    ------
    ValueError
        Bad arguments (naming the argument and the value), an invalid dataset, or fewer
        units than folds.
    """
    if not isinstance(errors, xr.Dataset):
        raise TypeError(f"errors must be an error dataset (xarray.Dataset), got {type(errors).__name__}")
    g = _unit_float("confidence", confidence)
    bl = _check_budgets(budgets)
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, got {folds!r}")
    by = tuple(by)
    if "op" not in by or "dtype" not in by or not set(by) <= {"op", "dtype", "hardware"}:
        raise ValueError(f"by must contain 'op' and 'dtype' (and optionally 'hardware'), got {by!r}")
    rules = _make_rules(methods)

    ds, bug = _split_buggy(errors, buggy)
    split = _make_folds(ds, bug, cluster, int(folds), seed)
    grp = _group_index(ds, bug, by)
    cells = _score_folds(rules, ds, bug, split, grp, bl, g, by, progress)
    pooled = _pool_folds(cells, bl, g)
    data = _result_dataset(cells, pooled, rules, grp, bl, g,
                           {"seed": int(seed), "cluster": cluster or "", "by": ",".join(by)})
    rows, group_rows = _summary_rows(cells, pooled, rules, grp, bl, g, int(ds.sizes["run"]))
    settings = {"methods": [r.name for r in rules], "rules": [r.describe() for r in rules], "budgets": bl,
                "folds": int(folds), "by": list(by), "cluster": cluster, "confidence": g, "seed": int(seed),
                "n_runs": int(ds.sizes["run"]), "n_buggy": 0 if bug is None else int(bug.sizes["run"]),
                "n_units": int(split.n_units)}
    return CompareResult(data, rows, group_rows, settings, split.fold, split.bfold)


def _check_budgets(budgets: Sequence[float] | float) -> list[float]:
    """The budgets as a list of distinct floats in (0, 1)."""
    if isinstance(budgets, (int, float)):
        budgets = (budgets,)
    bl = [_unit_float("budget", b) for b in budgets]
    if not bl or len(set(bl)) != len(bl):
        raise ValueError(f"budgets must be distinct numbers in (0, 1), got {list(budgets)!r}")
    return bl


def _make_rules(methods: Sequence[str | Mapping[str, Any] | Rule] | str | Mapping[str, Any] | Rule) -> list[Rule]:
    """The :class:`Rule` of each method spec; their names must be distinct."""
    if isinstance(methods, (str, Mapping, Rule)):
        methods = [methods]
    rules = [make_rule(m) for m in methods]
    names = [r.name for r in rules]
    if not rules or len(set(names)) != len(names):
        raise ValueError(f"methods must be a non-empty list with distinct names, got {names}")
    return rules


def _split_buggy(errors: xr.Dataset, buggy: xr.Dataset | None) -> tuple[xr.Dataset, xr.Dataset | None]:
    """Validated correct runs, and the buggy runs (``kind == "buggy"`` of ``errors`` plus ``buggy``)."""
    ds = _run_level_in_memory(validate(errors))
    bugs: list[xr.Dataset] = []
    if "kind" in ds.variables and ds["kind"].dims == ("run",):
        kind = np.asarray(ds["kind"].values).astype(str)
        if (kind == "buggy").any():
            bugs.append(ds.isel(run=np.flatnonzero(kind == "buggy")))
            ds = ds.isel(run=np.flatnonzero(kind != "buggy"))
            if ds.sizes["run"] == 0:
                raise ValueError("errors holds only buggy runs (kind == 'buggy'): no correct runs to calibrate on")
    if buggy is not None:
        if not isinstance(buggy, xr.Dataset):
            raise TypeError(f"buggy must be an error dataset (xarray.Dataset), got {type(buggy).__name__}")
        bugs.append(_run_level_in_memory(validate(buggy)))
    bug = (bugs[0] if len(bugs) == 1 else concat(bugs)) if bugs else None
    return ds, bug


@dataclass
class _Folds:
    """The split of the correct runs (and of the buggy runs) into folds."""

    fold: np.ndarray  # fold of each correct run
    bfold: np.ndarray  # fold of each buggy run
    n_units: int
    train_sets: list[xr.Dataset]
    test_idx: list[np.ndarray]
    test_sets: list[xr.Dataset]
    bug_idx: list[np.ndarray]
    bug_sets: list[xr.Dataset | None]

    @property
    def n(self) -> int:
        """Number of folds."""
        return len(self.test_idx)


def _fold_units(ds: xr.Dataset, bug: xr.Dataset | None, cluster: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Unit of the split of each correct and each buggy run.

    Correct runs: the units of :func:`tolstat.dataset.schema.run_units` (a declared ``cluster``
    and a shared reference join runs), so that no unit straddles a training and a held-out
    fold. A buggy run follows the unit of the correct runs on the same inputs (the same
    reference fingerprint, else the same ``cluster`` label), or is its own unit.
    """
    if cluster is not None:
        _label(ds, cluster, "cluster")  # a clear error naming the argument
    ids = run_units(ds, cluster).ids
    units = np.array([f"u{i}" for i in ids.tolist()])
    if bug is None:
        return units, None
    bu = [f"bug:{i}" for i in range(bug.sizes["run"])]
    if cluster is not None and cluster in bug.variables:
        by_label = dict(zip(_label(ds, cluster, "cluster").tolist(), units.tolist()))
        bu = [by_label.get(lab, f"label:{lab}") for lab in _label(bug, cluster, "cluster").tolist()]
    if FINGERPRINT in ds and FINGERPRINT in bug:
        by_ref = dict(zip(np.asarray(ds[FINGERPRINT].values).tolist(), units.tolist()))
        bu = [by_ref.get(f, b) for f, b in zip(np.asarray(bug[FINGERPRINT].values).tolist(), bu)]
    return units, np.array(bu)


def _make_folds(ds: xr.Dataset, bug: xr.Dataset | None, cluster: str | None, folds: int, seed: int) -> _Folds:
    """Assign every correct and buggy run a fold (:func:`assign_folds`) and cut the datasets."""
    units, bunits = _fold_units(ds, bug, cluster)
    allu = units if bunits is None else np.concatenate([units, bunits])
    n_units = np.unique(units).size
    if n_units < folds:
        raise ValueError(f"folds={folds} but the correct runs have only {n_units} "
                         f"{'distinct ' + repr(cluster) + ' values' if cluster else 'runs'}")
    fold_all = assign_folds(allu, folds, seed)
    fold, bfold = fold_all[: units.size], fold_all[units.size:]
    test_idx = [np.flatnonzero(fold == f) for f in range(folds)]
    bug_idx = [np.flatnonzero(bfold == f) for f in range(folds)]
    return _Folds(
        fold, bfold, int(n_units),
        train_sets=[ds.isel(run=np.flatnonzero(fold != f)) for f in range(folds)],
        test_idx=test_idx,
        test_sets=[ds.isel(run=ix) for ix in test_idx],
        bug_idx=bug_idx,
        bug_sets=[None if bug is None or ix.size == 0 else bug.isel(run=ix) for ix in bug_idx],
    )


@dataclass
class _Groups:
    """The threshold groups and the group of each run."""

    names: list[str]  # "op/dtype/hardware" keys, sorted
    gi: np.ndarray  # group index of each correct run
    bgi: np.ndarray  # group index of each buggy run (-1: a group without correct runs)


def _group_index(ds: xr.Dataset, bug: xr.Dataset | None, by: Sequence[str]) -> _Groups:
    gkeys = _keys(ds, by)
    groups = sorted(set(gkeys.tolist()))
    gidx = {k: i for i, k in enumerate(groups)}
    gi = np.array([gidx[k] for k in gkeys], dtype=np.int64)
    bgi = (np.array([gidx.get(k, -1) for k in _keys(bug, by)], dtype=np.int64) if bug is not None
           else np.empty(0, dtype=np.int64))
    return _Groups(groups, gi, bgi)


@dataclass
class _Cells:
    """Per (method, group, budget, fold) measures, filled fold by fold."""

    thr: np.ndarray
    n_train: np.ndarray
    n_test: np.ndarray
    fp: np.ndarray
    tight: np.ndarray
    n_bug: np.ndarray
    caught: np.ndarray
    status: np.ndarray
    reason: np.ndarray
    ratios: dict[tuple[int, int, int], list[np.ndarray]] = field(default_factory=dict)  # held-out, per fold

    @classmethod
    def empty(cls, shape: tuple[int, int, int, int]) -> _Cells:
        def z() -> np.ndarray:
            return np.zeros(shape, dtype=np.int64)

        return cls(np.full(shape, np.nan), z(), z(), z(), np.full(shape, np.nan), z(), z(),
                   np.full(shape, "ok", dtype=object), np.full(shape, "", dtype=object))


def _score_folds(rules: list[Rule], ds: xr.Dataset, bug: xr.Dataset | None, split: _Folds, grp: _Groups,
                 bl: list[float], g: float, by: Sequence[str], progress: bool | None) -> _Cells:
    """Calibrate every rule at every budget on every training fold; score the held-out runs."""
    from tqdm.auto import tqdm

    F = split.n
    cells = _Cells.empty((len(rules), len(grp.names), len(bl), F))
    train_counts = [np.bincount(grp.gi[split.fold != f], minlength=len(grp.names)) for f in range(F)]
    total = sum(1 if r.data_free else len(bl) * F for r in rules)
    bar = tqdm(total=total, desc="compare", disable=None if progress is None else not progress)
    for mi, rule in enumerate(rules):
        if rule.data_free:
            whole = calibrate_and_score(rule, None, ds, bug, budget=bl[0], confidence=g, by=by)
            bar.update(1)
        for bi, b in enumerate(bl):
            for f in range(F):
                if rule.data_free:
                    out = FoldOutcome(whole.thresholds, whole.reasons, whole.ratios[split.test_idx[f]],
                                      whole.buggy_ratios[split.bug_idx[f]] if bug is not None else np.empty(0),
                                      whole.error)
                else:
                    out = calibrate_and_score(rule, split.train_sets[f], split.test_sets[f], split.bug_sets[f],
                                              budget=b, confidence=g, by=by)
                    bar.update(1)
                _record_fold(cells, (mi, bi, f), rule, out, grp, split, train_counts[f])
    bar.close()
    return cells


def _fold_threshold(rule: Rule, out: FoldOutcome, k3: tuple[str, str, str]) -> tuple[float, str]:
    """Threshold of a group in one fold, and why there is none (``""`` when there is one)."""
    if isinstance(rule, StaticRule):
        t = rule.threshold(k3)
        return t, (f"no tolerances for dtype {k3[1]}" if math.isnan(t) else "")
    t = out.thresholds.get(k3, math.nan)
    why = out.reasons.get(k3, "no calibration runs of this group in the training folds") if math.isnan(t) else ""
    return t, why


def _record_fold(cells: _Cells, at: tuple[int, int, int], rule: Rule, out: FoldOutcome, grp: _Groups,
                 split: _Folds, train_counts: np.ndarray) -> None:
    """Store one (method, budget, fold) outcome in every group's cell."""
    mi, bi, f = at
    tg = grp.gi[split.test_idx[f]]
    bgf = grp.bgi[split.bug_idx[f]]
    for gj, key in enumerate(grp.names):
        ix = (mi, gj, bi, f)
        cells.n_train[ix] = train_counts[gj]
        if out.error:
            cells.status[ix], cells.reason[ix] = "refused", out.error
            continue
        cells.thr[ix], why = _fold_threshold(rule, out, _split_key(key))
        if why:
            cells.status[ix], cells.reason[ix] = "refused", why
            continue
        r = out.ratios[tg == gj]
        cells.n_test[ix] = r.size
        cells.fp[ix] = int(np.sum(r > 1.0))
        if r.size:
            cells.tight[ix] = float(np.median(r))
            cells.ratios.setdefault((mi, gj, bi), []).append(r)
        rb = out.buggy_ratios[bgf == gj]
        cells.n_bug[ix] = rb.size
        cells.caught[ix] = int(np.sum(rb > 1.0))


def _pool_folds(cells: _Cells, bl: list[float], g: float) -> dict[str, np.ndarray]:
    """Per (method, group, budget): counts summed over folds, intervals, verdict, tightness, stability."""
    M, G, B, F = cells.thr.shape
    p: dict[str, np.ndarray] = {
        "fp": cells.fp.sum(-1), "n_test": cells.n_test.sum(-1), "n_buggy": cells.n_bug.sum(-1),
        "caught": cells.caught.sum(-1), "refused": (cells.status != "ok").sum(-1),
        "tightness": np.full((M, G, B), np.nan), "stability": np.full((M, G, B), np.nan),
        "verdict": np.full((M, G, B), "", dtype=object),
    }
    p["fp_lo"], p["fp_hi"] = clopper_pearson(p["fp"], p["n_test"], g)
    for ix in np.ndindex(M, G, B):
        p["verdict"][ix] = budget_verdict(p["fp_lo"][ix], p["fp_hi"][ix], bl[ix[2]])
        rs = cells.ratios.get(ix)
        if rs:
            p["tightness"][ix] = float(np.median(np.concatenate(rs)))
        t = cells.thr[ix]
        t = t[np.isfinite(t)]
        if t.size == F:
            p["stability"][ix] = (float(t.max() / t.min()) if t.min() > 0 else (1.0 if t.max() == 0 else math.inf))
    return p


def _result_dataset(cells: _Cells, p: dict[str, np.ndarray], rules: list[Rule], grp: _Groups, bl: list[float],
                    g: float, attrs: dict[str, Any]) -> xr.Dataset:
    """The ``method x group x budget x fold`` dataset of :class:`CompareResult`."""
    lo, hi = clopper_pearson(cells.fp, cells.n_test, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        fp_rate = np.where(cells.n_test > 0, cells.fp / np.maximum(cells.n_test, 1), np.nan)
        recall = np.where(cells.n_bug > 0, cells.caught / np.maximum(cells.n_bug, 1), np.nan)
    b4 = np.array(bl)[None, None, :, None]
    per_fold = {"threshold": cells.thr, "status": cells.status.astype(str), "reason": cells.reason.astype(str),
                "n_train": cells.n_train, "n_test": cells.n_test, "fp": cells.fp, "fp_rate": fp_rate,
                "fp_lo": lo, "fp_hi": hi, "held": hi <= b4, "broken": lo > b4, "tightness": cells.tight,
                "n_buggy": cells.n_bug, "caught": cells.caught, "recall": recall}
    pooled = {"pooled_fp": p["fp"], "pooled_n_test": p["n_test"], "pooled_fp_lo": p["fp_lo"],
              "pooled_fp_hi": p["fp_hi"], "pooled_verdict": p["verdict"].astype(str),
              "pooled_tightness": p["tightness"], "stability": p["stability"], "pooled_n_buggy": p["n_buggy"],
              "pooled_caught": p["caught"]}
    gop, gdt, ghw = zip(*(_split_key(k) for k in grp.names))
    return xr.Dataset(
        {**{k: (("method", "group", "budget", "fold"), v) for k, v in per_fold.items()},
         **{k: (("method", "group", "budget"), v) for k, v in pooled.items()}},
        coords={
            "method": np.array([r.name for r in rules], dtype=str),
            "rule": ("method", np.array([r.describe() for r in rules], dtype=str)),
            "family": ("method", np.array([r.family for r in rules], dtype=str)),
            "budgeted": ("method", np.array([r.budgeted for r in rules], dtype=bool)),
            "group": np.array(grp.names, dtype=str),
            "op": ("group", np.array(gop, dtype=str)),
            "dtype": ("group", np.array(gdt, dtype=str)),
            "hardware": ("group", np.array(ghw, dtype=str)),
            "budget": np.array(bl, dtype=np.float64),
            "fold": np.arange(cells.thr.shape[-1], dtype=np.int64),
        },
        attrs={
            "tolstat_version": __version__,
            "confidence": g,
            **attrs,
            "meaning": ("held-out check statistic / threshold per method, group, budget, fold; "
                        "fp counts held-out correct runs with ratio > 1; held: Clopper-Pearson upper end "
                        "<= budget; broken: lower end > budget; verdict: held (upper <= budget), broken (lower > budget), "
                        "else consistent"),
        },
    )


def _summary_rows(cells: _Cells, p: dict[str, np.ndarray], rules: list[Rule], grp: _Groups, bl: list[float],
                  g: float, n_runs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tidy rows: per (method, budget) pooled over groups and folds, and per (method, group, budget)."""
    G = len(grp.names)
    group_rows = []
    for mi, rule in enumerate(rules):
        for gj, key in enumerate(grp.names):
            for bi, b in enumerate(bl):
                ix = (mi, gj, bi)
                rs = [str(x) for x in cells.reason[ix] if x]
                group_rows.append(_row(rule, b, int(p["fp"][ix]), int(p["n_test"][ix]), g, float(p["tightness"][ix]),
                                       float(p["stability"][ix]), int(p["n_buggy"][ix]), int(p["caught"][ix]),
                                       group=key, refused_folds=int(p["refused"][ix]), reason=rs[0] if rs else "",
                                       n_runs=int(np.sum(grp.gi == gj))))
    rows = []
    for mi, rule in enumerate(rules):
        for bi, b in enumerate(bl):
            rs = [np.concatenate(cells.ratios[(mi, gj, bi)]) for gj in range(G) if (mi, gj, bi) in cells.ratios]
            tt = float(np.median(np.concatenate(rs))) if rs else math.nan
            st = p["stability"][mi, :, bi]
            st = st[np.isfinite(st)]
            rows.append(_row(rule, b, int(p["fp"][mi, :, bi].sum()), int(p["n_test"][mi, :, bi].sum()), g, tt,
                             float(st.max()) if st.size else math.nan, int(p["n_buggy"][mi, :, bi].sum()),
                             int(p["caught"][mi, :, bi].sum()), refused_folds=int(p["refused"][mi, :, bi].sum()),
                             reason="", n_runs=n_runs))
    return rows, group_rows


def _row(rule: Rule, budget: float, fp: int, n: int, level: float, tight: float, stab: float, nb: int,
         caught: int, *, group: str | None = None, refused_folds: int = 0, reason: str = "",
         n_runs: int = 0) -> dict[str, Any]:
    lo, hi = clopper_pearson(fp, n, level)
    row: dict[str, Any] = {"method": rule.name, "family": rule.family, "budgeted": rule.budgeted}
    if group is not None:
        row["group"] = group
    row.update({
        "budget": budget, "n_runs": n_runs, "fp": fp, "n_test": n, "fp_rate": fp / n if n else math.nan,
        "fp_lo": lo, "fp_hi": hi, "verdict": budget_verdict(lo, hi, budget), "tightness": tight,
        "stability": stab, "n_buggy": nb, "caught": caught, "recall": caught / nb if nb else math.nan,
        "refused_folds": refused_folds, "reason": reason,
    })
    return row
