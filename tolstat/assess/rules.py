"""Tolerance rules: the methods that :func:`tolstat.compare` and ``tolstat evaluate`` compare.

A :class:`Rule` is calibrated on correct runs (:meth:`Rule.fit`) and then scores runs: the
check statistic of each run as a fraction of the threshold of its group (the check fails
when the ratio is above 1). This module holds the rule kinds (:class:`StaticRule`: fixed
``rtol``/``atol`` per dtype, :class:`StudyRule`: a multiple of a sample percentile,
:class:`SelectRule`: ``tolstat.select``), the calibrated form of a rule (:class:`Fitted`),
the registry of named methods (:data:`METHODS`, :data:`DEFAULT_METHODS`,
:data:`TORCH_DEFAULTS`) with :func:`make_rule`, which builds a rule from a name or a dict,
and the per-fold core :func:`calibrate_and_score` (one calibration set, one test set;
:class:`FoldOutcome`), which cross-validation and the corpus evaluation both call.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat.models.scale import ScaleModel, run_scores
from tolstat.calibration.decision import entry_run_values, ratio
from tolstat._base.util import ANY
from tolstat.calibration.options import SelectOptions
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
]

#: ``torch.testing.assert_close`` defaults ``(rtol, atol)`` per dtype
TORCH_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}

_SELECT_RESERVED = ("fp_budget", "confidence", "by", "on_error", "errors_or_fit")
#: settings of select given as keywords by a rule or ``shift``, passed in its ``options``
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SelectOptions))


def _select_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Keywords of :func:`tolstat.select` from ``settings``: those of
    :class:`~tolstat.calibration.options.SelectOptions` (``method``, ``seed``, ...; a
    ``scale``/``tail`` of None meaning the default) go into its ``options`` (replacing the
    fields of an ``options`` given too), the others are passed as they are."""
    kw = {k: v for k, v in settings.items() if k not in _OPTION_FIELDS}
    moved = {k: v for k, v in settings.items() if k in _OPTION_FIELDS and not (k in ("scale", "tail") and v is None)}
    if moved:
        base = kw.get("options")
        kw["options"] = dataclasses.replace(SelectOptions() if base is None else base, **moved)
    return kw


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


#: joins the labels of a group key: a control character, which no dataset label contains
#: (labels are printable text, :func:`tolstat._base.validate.label_value`), while an op
#: or hardware label may contain "/" (``nn/scale3``); :func:`display_key` shows a key
_KEY_SEP = "\x1f"


def _keys(ds: xr.Dataset, by: Sequence[str]) -> np.ndarray:
    """Group key of each run: op, dtype and hardware joined by :data:`_KEY_SEP`, with ``*``
    for labels not in ``by``; :func:`_split_key` inverts it."""
    cols = [np.asarray(ds[n].values).astype(str) if n in by else np.full(ds.sizes["run"], ANY)
            for n in ("op", "dtype", "hardware")]
    return np.array([_KEY_SEP.join(t) for t in zip(*cols)]) if ds.sizes["run"] else np.empty(0, dtype=str)


def display_key(k: str) -> str:
    """A group key as shown to users, ``op/dtype/hardware`` (the exact labels are in the
    result's ``op``, ``dtype`` and ``hardware`` coordinates)."""
    return "/".join(_split_key(k))


def _split_key(k: str) -> tuple[str, str, str]:
    op, dt, hw = k.split(_KEY_SEP)
    return op, dt, hw


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
    with :func:`tolstat.models.scale.run_scores` and an allclose :class:`tolstat.models.ScaleModel`.
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
                    out[m] = ratio(x[m], t)
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
                       **_select_kwargs(self.options))
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
                    r = np.maximum(r, ratio(x, ent.statistics[name].threshold))
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
