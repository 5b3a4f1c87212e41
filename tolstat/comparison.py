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
   variables exactly as the table defines it (:func:`tolstat.scale.run_scores` and
   :func:`tolstat.scale.bias_scores`, the functions :func:`tolstat.select` calibrates
   on); normalised statistics are exact because the element sample keeps each run's
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

import argparse
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr
from scipy import stats as _st

from ._version import __version__
from .dataset import concat, validate
from .scale import ScaleModel, bias_scores, run_scores
from ._util import ANY
from .selection import select

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
    """

    name: str = "rule"
    family: str = "static"
    budgeted: bool = False
    data_free: bool = False

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


def _keys(ds: xr.Dataset, by: Sequence[str]) -> np.ndarray:
    """Group key of each run: ``op/dtype/hardware`` with ``*`` for labels not in ``by``."""
    cols = [np.asarray(ds[n].values).astype(str) if n in by else np.full(ds.sizes["run"], ANY)
            for n in ("op", "dtype", "hardware")]
    return np.array(["/".join(t) for t in zip(*cols)]) if ds.sizes["run"] else np.empty(0, dtype=str)


def _split_key(k: str) -> tuple[str, str, str]:
    op, dt, hw = k.split("/", 2)
    return op, dt, hw


def _ratio(x: np.ndarray, thr: float) -> np.ndarray:
    """``x / thr`` with ``0/0 = 0`` (a zero threshold passes only exact results)."""
    x = np.asarray(x, dtype=np.float64)
    if thr == 0.0:
        return np.where(x > 0, np.inf, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return x / thr


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
    with :func:`tolstat.scale.run_scores` and an allclose :class:`tolstat.ScaleModel`.
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
    every statistic of the entry (:func:`tolstat.scale.run_scores` with the entry's
    scale model, :func:`tolstat.scale.bias_scores`) over its threshold, the largest of
    them being the run's ratio. Groups ``select`` refuses (too few runs for the budget)
    are kept with the reason (``on_error="skip"``).
    """

    family = "tolstat"
    budgeted = True

    def __init__(self, name: str, **options: Any):
        bad = [k for k in options if k in _SELECT_RESERVED]
        if bad:
            raise ValueError(f"method {name!r}: {bad} are set by compare itself (budgets=, confidence=, by=)")
        # form=None unless given: compare scores held-out runs from the dataset's run variables,
        # which the operator form (select's default) does not define per statistic here
        self.name, self.options = name, {"form": None, **options}

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        table = select(train, fp_budget=budget, confidence=confidence, by=tuple(by), on_error="skip",
                       **self.options)
        stat = self.options.get("statistic", "max_abs")
        base = next(s for s in ([stat] if isinstance(stat, str) else list(stat)) if s != "bias")
        d = table.data
        thr: dict[tuple[str, str, str], float] = {}
        reasons: dict[tuple[str, str, str], str] = {}
        for i, key in enumerate(table.groups):
            t = float(d["threshold"].values[i, 0])
            thr[key] = t
            if math.isnan(t):
                reasons[key] = str(d["reason"].values[i, 0])

        def score(ds: xr.Dataset) -> np.ndarray:
            need = ("sample_abs", "sample_ref") if self.options.get("form") is not None else ()
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
                for name, st in ent.statistics.items():
                    x = bias_scores(sub) if name == "bias" else run_scores(sub, ent.scale, base).scores
                    r = np.maximum(r, _ratio(x, st.threshold))
                out[idx] = r
            return out

        return Fitted(thr, reasons, score, table)

    def describe(self) -> str:  # noqa: D102
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"tolstat.select(fp_budget=B, confidence=C{', ' + opts if opts else ''})"


#: named methods (``methods=`` accepts these names, dicts and :class:`Rule` objects)
METHODS: dict[str, Any] = {
    "torch-defaults": lambda: StaticRule("torch-defaults", TORCH_DEFAULTS),
    "atol=rtol=1e-2": lambda: StaticRule("atol=rtol=1e-2", {d: (1e-2, 1e-2) for d in TORCH_DEFAULTS}),
    "study": lambda: StudyRule("study"),
    "tolstat": lambda: SelectRule("tolstat"),
    "tolstat-max_abs": lambda: SelectRule("tolstat-max_abs", statistic="max_abs"),
    "tolstat-max_ulp": lambda: SelectRule("tolstat-max_ulp", statistic="max_ulp"),
    "tolstat-allclose": lambda: SelectRule("tolstat-allclose", form="allclose"),
    "tolstat-size_aware": lambda: SelectRule("tolstat-size_aware", form="size_aware"),
    "tolstat-max_abs+bias": lambda: SelectRule("tolstat-max_abs+bias", statistic=("max_abs", "bias")),
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


def _cp(k: Any, n: Any, level: float) -> tuple[Any, Any]:
    """Two-sided exact (Clopper-Pearson) interval of ``k`` successes in ``n`` trials.

    The closed form with beta quantiles, vectorised; it is the interval of
    ``scipy.stats.binomtest(k, n).proportion_ci(level, method="exact")`` (tested to
    agree), without its per-call root finding. NaN where ``n == 0``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    a = (1.0 - level) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, _st.beta.ppf(a, k, n - k + 1), 0.0)
        hi = np.where(k < n, _st.beta.ppf(1.0 - a, k + 1, n - k), 1.0)
    lo = np.where(n > 0, lo, np.nan)
    hi = np.where(n > 0, hi, np.nan)
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def _verdict(lo: float, hi: float, budget: float) -> str:
    if math.isnan(hi):
        return "no data"
    if hi <= budget:
        return "held"
    if lo > budget:
        return "broken"
    return "consistent"


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

    def write(self, out_dir: str | os.PathLike[str], *, plots: bool = True) -> list[Path]:
        """``compare.json``, ``compare.nc``, ``summary.txt`` and, with matplotlib, the plots."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        text = self.summary() + "\n\n" + self.summary(per_group=True) + "\n"
        written = [self.to_json(out / "compare.json"), self.to_netcdf(out / "compare.nc"),
                   _atomic(out / "summary.txt", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))]
        if plots:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                return written
            written += plot_compare(self, out)
        return written


def _atomic(dest: Path, write: Any) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


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
    from tqdm.auto import tqdm

    if not isinstance(errors, xr.Dataset):
        raise TypeError(f"errors must be an error dataset (xarray.Dataset), got {type(errors).__name__}")
    g = _unit_float("confidence", confidence)
    if isinstance(budgets, (int, float)):
        budgets = (budgets,)
    bl = [_unit_float("budget", b) for b in budgets]
    if not bl or len(set(bl)) != len(bl):
        raise ValueError(f"budgets must be distinct numbers in (0, 1), got {list(budgets)!r}")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, got {folds!r}")
    by = tuple(by)
    if "op" not in by or "dtype" not in by or not set(by) <= {"op", "dtype", "hardware"}:
        raise ValueError(f"by must contain 'op' and 'dtype' (and optionally 'hardware'), got {by!r}")
    if isinstance(methods, (str, Mapping, Rule)):
        methods = [methods]
    rules = [make_rule(m) for m in methods]
    names = [r.name for r in rules]
    if not rules or len(set(names)) != len(names):
        raise ValueError(f"methods must be a non-empty list with distinct names, got {names}")

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

    # folds
    if cluster is None:
        units = np.arange(ds.sizes["run"]).astype(str)
        bunits = None if bug is None else np.array([f"bug:{i}" for i in range(bug.sizes["run"])])
    else:
        units = _label(ds, cluster, "cluster")
        bunits = None
        if bug is not None:
            bunits = (_label(bug, cluster, "cluster") if cluster in bug.variables
                      else np.array([f"bug:{i}" for i in range(bug.sizes["run"])]))
    allu = units if bunits is None else np.concatenate([units, bunits])
    n_units = np.unique(units).size
    if n_units < folds:
        raise ValueError(f"folds={folds} but the correct runs have only {n_units} "
                         f"{'distinct ' + repr(cluster) + ' values' if cluster else 'runs'}")
    fold_all = assign_folds(allu, int(folds), seed)
    fold = fold_all[: units.size]
    bfold = fold_all[units.size:]

    gkeys = _keys(ds, by)
    groups = sorted(set(gkeys.tolist()))
    gidx = {k: i for i, k in enumerate(groups)}
    gi = np.array([gidx[k] for k in gkeys], dtype=np.int64)
    if bug is not None:
        bk = _keys(bug, by)
        bgi = np.array([gidx.get(k, -1) for k in bk], dtype=np.int64)
    else:
        bgi = np.empty(0, dtype=np.int64)

    M, G, B, F = len(rules), len(groups), len(bl), int(folds)
    shape = (M, G, B, F)
    thr = np.full(shape, np.nan)
    n_train = np.zeros(shape, dtype=np.int64)
    n_test = np.zeros(shape, dtype=np.int64)
    fp = np.zeros(shape, dtype=np.int64)
    tight = np.full(shape, np.nan)
    n_bug = np.zeros(shape, dtype=np.int64)
    caught = np.zeros(shape, dtype=np.int64)
    status = np.full(shape, "ok", dtype=object)
    reason = np.full(shape, "", dtype=object)
    pooled_ratios: dict[tuple[int, int, int], list[np.ndarray]] = {}

    train_sets = [ds.isel(run=np.flatnonzero(fold != f)) for f in range(F)]
    test_idx = [np.flatnonzero(fold == f) for f in range(F)]
    test_sets = [ds.isel(run=ix) for ix in test_idx]
    bug_idx = [np.flatnonzero(bfold == f) for f in range(F)]
    bug_sets = [None if bug is None or ix.size == 0 else bug.isel(run=ix) for ix in bug_idx]
    train_counts = [np.bincount(gi[fold != f], minlength=G) for f in range(F)]

    total = sum(1 if r.data_free else B * F for r in rules)
    bar = tqdm(total=total, desc="compare", disable=None if progress is None else not progress)
    for mi, rule in enumerate(rules):
        if rule.data_free:
            whole = calibrate_and_score(rule, None, ds, bug, budget=bl[0], confidence=g, by=by)
            bar.update(1)
        for bi, b in enumerate(bl):
            for f in range(F):
                if rule.data_free:
                    out = FoldOutcome(whole.thresholds, whole.reasons, whole.ratios[test_idx[f]],
                                      whole.buggy_ratios[bug_idx[f]] if bug is not None else np.empty(0),
                                      whole.error)
                else:
                    out = calibrate_and_score(rule, train_sets[f], test_sets[f], bug_sets[f], budget=b,
                                              confidence=g, by=by)
                    bar.update(1)
                tg = gi[test_idx[f]]
                bgf = bgi[bug_idx[f]]
                for gj, key in enumerate(groups):
                    k3 = _split_key(key)
                    n_train[mi, gj, bi, f] = train_counts[f][gj]
                    if out.error:
                        status[mi, gj, bi, f], reason[mi, gj, bi, f] = "refused", out.error
                        continue
                    if isinstance(rule, StaticRule):
                        t = rule.threshold(k3)
                        if math.isnan(t):
                            status[mi, gj, bi, f] = "refused"
                            reason[mi, gj, bi, f] = f"no tolerances for dtype {k3[1]}"
                    else:
                        t = out.thresholds.get(k3, math.nan)
                        if math.isnan(t):
                            status[mi, gj, bi, f] = "refused"
                            reason[mi, gj, bi, f] = out.reasons.get(
                                k3, "no calibration runs of this group in the training folds")
                    thr[mi, gj, bi, f] = t
                    if status[mi, gj, bi, f] != "ok":
                        continue
                    r = out.ratios[tg == gj]
                    n_test[mi, gj, bi, f] = r.size
                    fp[mi, gj, bi, f] = int(np.sum(r > 1.0))
                    if r.size:
                        tight[mi, gj, bi, f] = float(np.median(r))
                        pooled_ratios.setdefault((mi, gj, bi), []).append(r)
                    rb = out.buggy_ratios[bgf == gj]
                    n_bug[mi, gj, bi, f] = rb.size
                    caught[mi, gj, bi, f] = int(np.sum(rb > 1.0))
    bar.close()

    lo, hi = _cp(fp, n_test, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        fp_rate = np.where(n_test > 0, fp / np.maximum(n_test, 1), np.nan)
        recall = np.where(n_bug > 0, caught / np.maximum(n_bug, 1), np.nan)

    # pooled over folds
    pshape = (M, G, B)
    p_fp, p_n = fp.sum(-1), n_test.sum(-1)
    p_bug, p_caught = n_bug.sum(-1), caught.sum(-1)
    p_lo, p_hi = _cp(p_fp, p_n, g)
    p_tight, p_stab = np.full(pshape, np.nan), np.full(pshape, np.nan)
    p_verdict = np.full(pshape, "", dtype=object)
    p_refused = (status != "ok").sum(-1)
    for ix in np.ndindex(*pshape):
        p_verdict[ix] = _verdict(p_lo[ix], p_hi[ix], bl[ix[2]])
        rs = pooled_ratios.get(ix)
        if rs:
            p_tight[ix] = float(np.median(np.concatenate(rs)))
        t = thr[ix]
        t = t[np.isfinite(t)]
        if t.size == F:
            p_stab[ix] = (float(t.max() / t.min()) if t.min() > 0 else (1.0 if t.max() == 0 else math.inf))

    gop, gdt, ghw = zip(*(_split_key(k) for k in groups))
    data = xr.Dataset(
        {
            "threshold": (("method", "group", "budget", "fold"), thr),
            "status": (("method", "group", "budget", "fold"), status.astype(str)),
            "reason": (("method", "group", "budget", "fold"), reason.astype(str)),
            "n_train": (("method", "group", "budget", "fold"), n_train),
            "n_test": (("method", "group", "budget", "fold"), n_test),
            "fp": (("method", "group", "budget", "fold"), fp),
            "fp_rate": (("method", "group", "budget", "fold"), fp_rate),
            "fp_lo": (("method", "group", "budget", "fold"), lo),
            "fp_hi": (("method", "group", "budget", "fold"), hi),
            "held": (("method", "group", "budget", "fold"), hi <= np.array(bl)[None, None, :, None]),
            "broken": (("method", "group", "budget", "fold"), lo > np.array(bl)[None, None, :, None]),
            "tightness": (("method", "group", "budget", "fold"), tight),
            "n_buggy": (("method", "group", "budget", "fold"), n_bug),
            "caught": (("method", "group", "budget", "fold"), caught),
            "recall": (("method", "group", "budget", "fold"), recall),
            "pooled_fp": (("method", "group", "budget"), p_fp),
            "pooled_n_test": (("method", "group", "budget"), p_n),
            "pooled_fp_lo": (("method", "group", "budget"), p_lo),
            "pooled_fp_hi": (("method", "group", "budget"), p_hi),
            "pooled_verdict": (("method", "group", "budget"), p_verdict.astype(str)),
            "pooled_tightness": (("method", "group", "budget"), p_tight),
            "stability": (("method", "group", "budget"), p_stab),
            "pooled_n_buggy": (("method", "group", "budget"), p_bug),
            "pooled_caught": (("method", "group", "budget"), p_caught),
        },
        coords={
            "method": np.array(names, dtype=str),
            "rule": ("method", np.array([r.describe() for r in rules], dtype=str)),
            "family": ("method", np.array([r.family for r in rules], dtype=str)),
            "budgeted": ("method", np.array([r.budgeted for r in rules], dtype=bool)),
            "group": np.array(groups, dtype=str),
            "op": ("group", np.array(gop, dtype=str)),
            "dtype": ("group", np.array(gdt, dtype=str)),
            "hardware": ("group", np.array(ghw, dtype=str)),
            "budget": np.array(bl, dtype=np.float64),
            "fold": np.arange(F, dtype=np.int64),
        },
        attrs={
            "tolstat_version": __version__,
            "confidence": g,
            "seed": int(seed),
            "cluster": cluster or "",
            "by": ",".join(by),
            "meaning": ("held-out check statistic / threshold per method, group, budget, fold; "
                        "fp counts held-out correct runs with ratio > 1; held: Clopper-Pearson upper end "
                        "<= budget; broken: lower end > budget; verdict: held (upper <= budget), broken (lower > budget), "
                        "else consistent"),
        },
    )
    group_rows = []
    for mi, rule in enumerate(rules):
        for gj, key in enumerate(groups):
            for bi, b in enumerate(bl):
                ix = (mi, gj, bi)
                rs = [str(x) for x in reason[ix] if x]
                group_rows.append(_row(rule, b, int(p_fp[ix]), int(p_n[ix]), g, float(p_tight[ix]),
                                       float(p_stab[ix]), int(p_bug[ix]), int(p_caught[ix]),
                                       group=key, refused_folds=int(p_refused[ix]), reason=rs[0] if rs else "",
                                       n_runs=int(np.sum(gi == gj))))
    rows = []
    for mi, rule in enumerate(rules):
        for bi, b in enumerate(bl):
            rs = [np.concatenate(pooled_ratios[(mi, gj, bi)]) for gj in range(G) if (mi, gj, bi) in pooled_ratios]
            tt = float(np.median(np.concatenate(rs))) if rs else math.nan
            st = p_stab[mi, :, bi]
            st = st[np.isfinite(st)]
            rows.append(_row(rule, b, int(p_fp[mi, :, bi].sum()), int(p_n[mi, :, bi].sum()), g, tt,
                             float(st.max()) if st.size else math.nan, int(p_bug[mi, :, bi].sum()),
                             int(p_caught[mi, :, bi].sum()), refused_folds=int(p_refused[mi, :, bi].sum()),
                             reason="", n_runs=int(ds.sizes["run"])))
    settings = {"methods": names, "rules": [r.describe() for r in rules], "budgets": bl, "folds": F,
                "by": list(by), "cluster": cluster, "confidence": g, "seed": int(seed),
                "n_runs": int(ds.sizes["run"]), "n_buggy": 0 if bug is None else int(bug.sizes["run"]),
                "n_units": int(n_units)}
    return CompareResult(data, rows, group_rows, settings, fold, bfold)


def _row(rule: Rule, budget: float, fp: int, n: int, level: float, tight: float, stab: float, nb: int,
         caught: int, *, group: str | None = None, refused_folds: int = 0, reason: str = "",
         n_runs: int = 0) -> dict[str, Any]:
    lo, hi = _cp(fp, n, level)
    row: dict[str, Any] = {"method": rule.name, "family": rule.family, "budgeted": rule.budgeted}
    if group is not None:
        row["group"] = group
    row.update({
        "budget": budget, "n_runs": n_runs, "fp": fp, "n_test": n, "fp_rate": fp / n if n else math.nan,
        "fp_lo": lo, "fp_hi": hi, "verdict": _verdict(lo, hi, budget), "tightness": tight,
        "stability": stab, "n_buggy": nb, "caught": caught, "recall": caught / nb if nb else math.nan,
        "refused_folds": refused_folds, "reason": reason,
    })
    return row


# --------------------------------------------------------------------------- plots
def plot_compare(result: CompareResult, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Recall vs FP, thresholds across folds, and realised FP against budget (PNG, atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    d = result.data
    paths = []
    budgets = [float(b) for b in d.budget.values]

    def save(fig: Any, name: str) -> None:
        paths.append(_atomic(out / name, lambda tmp: fig.savefig(tmp, dpi=110, format="png")))
        plt.close(fig)

    # calibration curve: realised pooled FP against budget
    floor = min(budgets) / 20  # zero false positives are drawn here
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for r_name in d.method.values:
        rows = [r for r in result.rows if r["method"] == r_name]
        x = [r["budget"] for r in rows]
        y = [max(r["fp_rate"], floor) for r in rows]
        yerr = [[max(yy - max(r["fp_lo"], floor), 0) for yy, r in zip(y, rows)],
                [max(r["fp_hi"] - yy, 0) for yy, r in zip(y, rows)]]
        ax.errorbar(x, y, yerr=yerr, marker="o", capsize=3, label=str(r_name))
    lim = [min(budgets) / 3, max(budgets) * 3]
    ax.plot(lim, lim, "k--", lw=1, label="FP = budget")
    ax.set(xscale="log", yscale="log", xlabel="budget", ylabel=f"realised held-out FP rate (0 drawn at {floor:g})",
           title="calibration: realised FP against budget")
    ax.legend(fontsize=7)
    save(fig, "calibration.png")
    # recall vs FP
    if any(r["n_buggy"] for r in result.rows):
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        for r in result.rows:
            ax.scatter(max(r["fp_rate"], 1e-5), r["recall"], label=f"{r['method']} @ {r['budget']:g}")
        ax.set(xscale="log", xlabel="held-out FP rate", ylabel="recall on buggy runs", title="recall vs FP")
        ax.legend(fontsize=6)
        save(fig, "recall_fp.png")
    # thresholds across folds (max-error statistic; static rules have threshold 1)
    fig, ax = plt.subplots(figsize=(7, 5))
    labels, vals = [], []
    one_hw = len(set(d.hardware.values.tolist())) == 1
    for mi, m in enumerate(d.method.values):
        if d.family.values[mi] == "static":
            continue
        for gj, gname in enumerate(d.group.values):
            t = d.threshold.values[mi, gj, 0, :]
            t = t[np.isfinite(t)]
            if t.size:
                labels.append(f"{m}\n{d.op.values[gj]}/{d.dtype.values[gj]}"
                              + ("" if one_hw else f"\n{d.hardware.values[gj]}"))
                vals.append(t / np.median(t) if np.median(t) > 0 else t)
    if vals:
        ax.boxplot(vals)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=90, fontsize=6)
    ax.set(ylabel="threshold / median over folds", title=f"thresholds across folds (budget {budgets[0]:g})")
    fig.tight_layout()
    save(fig, "thresholds.png")
    return paths


# --------------------------------------------------------------------------- CLI
def _parse_budgets(text: str) -> list[float]:
    out = []
    for item in text.split(","):
        try:
            out.append(float(item))
        except ValueError:
            raise ValueError(f"--budgets must be comma-separated numbers, got {text!r}") from None
    return out


def _cmd_compare(args: Any) -> int:
    from .io import open_errors

    budgets = _parse_budgets(args.budgets)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else list(DEFAULT_METHODS)
    chunks = {"run": args.chunks} if args.chunks else None
    ds = open_errors(args.errors, chunks=chunks)
    bugs = open_errors(args.buggy, chunks=chunks) if args.buggy else None
    by = ("op", "dtype") if args.pool_hardware else ("op", "dtype", "hardware")
    res = compare(ds, methods=methods, budgets=budgets, folds=args.folds, buggy=bugs, by=by,
                  cluster=args.cluster, confidence=args.confidence, seed=args.seed, progress=args.progress)
    s = res.settings
    print(f"tolstat compare: {s['n_runs']} correct runs ({s['n_units']} "
          f"{'clusters ' + repr(s['cluster']) if s['cluster'] else 'units'}), {s['n_buggy']} buggy runs, "
          f"{s['folds']} folds, confidence {s['confidence']:g}\n")
    print(res.summary())
    if args.per_group:
        print()
        print(res.summary(per_group=True))
    if args.output:
        paths = res.write(args.output, plots=not args.no_plots)
        print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


def add_cli(sub: Any) -> None:
    """Register ``tolstat compare`` on an argparse sub-parser collection."""
    c = sub.add_parser("compare", help="cross-validated comparison of tolerance methods on an error dataset")
    c.add_argument("errors", help="error dataset of correct runs (.nc or .zarr); runs labelled kind=buggy "
                   "are taken as buggy")
    c.add_argument("--buggy", help="error dataset of known-bad runs (recall)")
    c.add_argument("--budgets", default="1e-2,1e-3", help="comma-separated false-positive budgets")
    c.add_argument("--folds", type=int, default=5)
    c.add_argument("--methods", default=None,
                   help=f"comma-separated names (default: {','.join(DEFAULT_METHODS)}; known: "
                        f"{','.join(METHODS)})")
    c.add_argument("--cluster", default=None, help="label whose runs stay in one fold (e.g. case)")
    c.add_argument("--confidence", type=float, default=0.95)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--pool-hardware", action="store_true", help="one threshold per (op, dtype)")
    c.add_argument("--chunks", type=int, default=None, help="open the tables dask-backed, N runs a chunk")
    c.add_argument("--per-group", action="store_true", help="also print one line per group")
    c.add_argument("-o", "--output", default=None, help="folder for compare.json, compare.nc, plots")
    c.add_argument("--no-plots", action="store_true")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    c.set_defaults(func=_cmd_compare)
