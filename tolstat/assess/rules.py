"""Tolerance rules: the methods that :func:`tolstat.compare` and ``tolstat evaluate`` compare.

A :class:`Rule` is calibrated on correct runs (:meth:`Rule.fit`) and then scores runs: the
check statistic of each run as a fraction of the threshold of its group (the check fails
when the ratio is above 1). This module holds the rule kinds (:class:`StaticRule`: fixed
``rtol``/``atol`` per dtype, :class:`StudyRule`: a multiple of a sample percentile,
:class:`SelectRule`: ``tolstat.select``), the peers' rules (:class:`GpucheckRule`: gpucheck's
defaults with ``atol`` scaled by ``sqrt(K/128)``; :class:`DynamoSameRule`: torch dynamo's
accuracy rule, RMSE against float64 at most a multiple of the eager kernel's;
:class:`FlashAttentionRule`: FlashAttention's tests, max error at most twice the eager
kernel's plus a rounding term) with the run variables the eager-relative ones read
(:class:`EagerBaseline`, :data:`PEER_VARIABLES`), the calibrated form of a rule (:class:`Fitted`),
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
from tolstat.models.statistics import get as get_statistic
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
    "GpucheckRule",
    "DynamoSameRule",
    "FlashAttentionRule",
    "EagerBaseline",
    "dynamo_multiplier",
    "PEER_VARIABLES",
    "GPUCHECK_DEFAULTS",
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
    family : {"static", "study", "tolstat", "eager-relative"}
        ``"eager-relative"``: a peer's rule that bounds the error by that of an eager
        kernel run on the same inputs (:class:`DynamoSameRule`, :class:`FlashAttentionRule`).
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

    def fixed_threshold(self, key: tuple[str, str, str]) -> float | None:
        """The threshold of a rule that needs no calibration, for group ``key`` (NaN: the rule
        cannot check the group); None for a calibrated rule (its thresholds are in
        :attr:`Fitted.thresholds`)."""
        return None

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

    def fixed_threshold(self, key: tuple[str, str, str]) -> float:  # noqa: D102
        return self.threshold(key)

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


# --------------------------------------------------------------------------- the peers' rules
#: gpucheck's default ``(rtol, atol)`` per dtype (``gpucheck.assertions.tolerances``: atol = rtol
#: for the 16-bit formats); :class:`GpucheckRule` scales ``atol`` by ``sqrt(K/128)``
GPUCHECK_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
    "float32": (1e-4, 1e-4),
    "float64": (1e-7, 1e-10),
}

#: run variables of the eager-relative rules, written by :class:`EagerBaseline` (each a float
#: per run; the corpus evaluation stores them at collection, from the same inputs)
PEER_VARIABLES: dict[str, str] = {
    "peer_rmse": "RMSE of the output against the float64 reference",
    "peer_eager_rmse": "RMSE of the eager kernel's output (same inputs) against the float64 reference",
    "peer_eager_close": "max |out - eager| / (1 + |out|): torch.allclose(eager, out, atol=t, rtol=t) holds "
                        "exactly when it is <= t (0 where equal, inf where one is NaN or one non-finite)",
    "peer_max_abs_lp": "max |out - ref_lp|, ref_lp the float64 reference rounded to the storage dtype "
                       "(inf where the output is NaN)",
    "peer_eager_max_abs_lp": "max |eager - ref_lp|",
    "peer_fa_atol": "2 max |(ref_lp + 0.3) - 0.3 - ref_lp| in the storage dtype: FlashAttention's rounding term",
}


def _lp(x: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 operation's result as the storage dtype stores it (float64 array)."""
    from tolstat._base.dtypes import round_to_format

    return round_to_format(np.asarray(x, dtype=np.float32), dtype).astype(np.float64)


class EagerBaseline:
    """The eager kernel's output on one case, and the peer variables of runs on that case.

    Parameters
    ----------
    eager : array_like
        The eager kernel's output on the case's inputs (the corpus: its plain variant).
    reference : array_like
        The float64 reference on the same inputs.
    dtype : str
        The storage dtype of the outputs.

    :meth:`variables` gives the :data:`PEER_VARIABLES` of one output on the same case;
    the eager kernel's own (``peer_eager_*``, ``peer_fa_atol``) are computed once here.
    """

    def __init__(self, eager: Any, reference: Any, dtype: str):
        from tolstat._base.dtypes import canonical_dtype, round_to_format

        self.dtype = canonical_dtype(dtype)
        self.ref = np.asarray(reference, dtype=np.float64)
        self.eager = np.asarray(eager).astype(np.float64)
        if self.eager.shape != self.ref.shape:
            raise ValueError(f"eager output shape {self.eager.shape} != reference shape {self.ref.shape}")
        # FlashAttention's out_ref: the reference in the storage dtype
        self.ref_lp = round_to_format(self.ref, self.dtype).astype(np.float64)
        with np.errstate(all="ignore"):
            x = self.ref_lp.astype(np.float32)
            third = np.float32(0.3)
            t = _lp(x + third, self.dtype).astype(np.float32)
            u = _lp(t - third, self.dtype).astype(np.float32)
            v = _lp(u - x, self.dtype)
            fa = 2.0 * float(np.abs(v).max()) if v.size else 0.0  # NaN (an infinite ref_lp) propagates
        # flat C-order copies for the one-pass kernel (tolstat.assess.peer_kernels)
        self._flat = tuple(np.ascontiguousarray(x).ravel() for x in (self.eager, self.ref, self.ref_lp))
        rmse, _, lp = self._pass(self._flat[0])
        self.case = {"peer_eager_rmse": rmse, "peer_eager_max_abs_lp": lp, "peer_fa_atol": fa}

    def _pass(self, a: np.ndarray) -> tuple[float, float, float]:
        """``(rmse, close, max_abs_lp)`` of the flat float64 output ``a``: one kernel pass,
        then numpy's sum of squares of ``ref - a`` (NaN and inf propagate into the RMSE)."""
        from tolstat.assess.peer_kernels import peer_pass

        eager, ref, ref_lp = self._flat
        d = np.empty_like(a)
        close, lp = peer_pass(a, eager, ref, ref_lp, d)
        with np.errstate(all="ignore"):
            rmse = float(np.sqrt(np.dot(d, d) / d.size)) if d.size else 0.0
        return rmse, float(close), float(lp)

    def variables(self, actual: Any) -> dict[str, float]:
        """The :data:`PEER_VARIABLES` of ``actual``, an output on the same case."""
        a = np.asarray(actual).astype(np.float64)
        if a.shape != self.ref.shape:
            raise ValueError(f"output shape {a.shape} != reference shape {self.ref.shape}")
        rmse, close, lp = self._pass(np.ascontiguousarray(a).ravel())
        return {"peer_rmse": rmse, **self.case, "peer_eager_close": close, "peer_max_abs_lp": lp}


def _peer_values(ds: xr.Dataset, rule: str, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The run variables ``names`` of ``ds``; a clear error naming how to make them when missing."""
    missing = [n for n in names if n not in ds.variables]
    if missing:
        raise ValueError(f"{rule} needs the run variables {missing} (the eager kernel's errors on the same "
                         "inputs; tolstat.assess.rules.EagerBaseline computes them, tolstat evaluate stores them)")
    return {n: np.asarray(ds[n].values, dtype=np.float64) for n in names}


def _ratio_each(x: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """``x / thr`` per run, such that it is > 1 exactly when ``x <= thr`` fails: 0 where
    ``x`` is 0 and passes (0/0), above 1 (inf for NaN) where it fails."""
    with np.errstate(invalid="ignore", divide="ignore"):
        r = x / thr
    ok = x <= thr  # NaN on either side fails, as in the peers' comparisons
    return np.where(ok, np.where(x == 0, 0.0, np.minimum(r, 1.0)),
                    np.maximum(np.where(np.isnan(r), np.inf, r), np.nextafter(1.0, 2.0)))


class GpucheckRule(StaticRule):
    """gpucheck's defaults: ``|d| <= atol + rtol*|ref|`` with ``atol`` scaled by ``sqrt(K/128)``.

    ``(rtol, atol)`` per dtype (:data:`GPUCHECK_DEFAULTS`: fp16 1e-2, bf16 5e-2), and
    ``atol * sqrt(K / 128)`` (``rtol`` unchanged) for runs whose covariate ``k_covariate``
    is above 1: gpucheck's ``k_dim``, passed for ops that reduce; a run without it (or
    with K = 1, a pointwise op) is checked at the base tolerances. The run statistic is
    that of :class:`StaticRule` (threshold 1).
    """

    def __init__(self, name: str = "gpucheck", tolerances: Mapping[str, tuple[float, float]] | None = None,
                 k_covariate: str = "K"):
        super().__init__(name, GPUCHECK_DEFAULTS if tolerances is None else tolerances)
        self.k_covariate = k_covariate

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        def score_block(ds: xr.Dataset) -> np.ndarray:
            out = np.full(ds.sizes["run"], np.nan)
            dts = np.asarray(ds["dtype"].values).astype(str)
            k = (np.asarray(ds[self.k_covariate].values, dtype=np.float64) if self.k_covariate in ds.variables
                 else np.full(dts.size, np.nan))
            scale = np.where(k > 1, np.sqrt(np.where(k > 1, k, 1.0) / 128.0), 1.0)  # NaN K: no k_dim
            # the score's own variables only: one cut per scale then copies no other
            base = ds[[v for v in get_statistic("max_score").needs if v in ds.data_vars]]  # (coordinates come too)
            for dt in np.unique(dts):
                if dt not in self.tolerances:
                    continue
                r, a = self.tolerances[dt]
                for s in np.unique(scale[dts == dt]):
                    idx = np.flatnonzero((dts == dt) & (scale == s))
                    sub = base.isel(run=idx) if idx.size != dts.size else base
                    out[idx] = run_scores(sub, ScaleModel("allclose", atol=a * float(s), rtol=r)).scores
            return out

        def score(ds: xr.Dataset) -> np.ndarray:
            return _per_block(ds, score_block, ("sample_abs", "sample_ref"))

        return Fitted({}, {}, score)

    def describe(self) -> str:  # noqa: D102
        return ("gpucheck allclose, atol x sqrt(K/128) where K > 1; "
                + "; ".join(f"{d}: rtol={r:g} atol={a:g}" for d, (r, a) in self.tolerances.items()))


def dynamo_multiplier(dtype: str, n_elements: Any, tol: float) -> np.ndarray:
    """The RMSE multiplier of ``torch._dynamo.utils.same`` (without
    ``use_larger_multiplier_for_smaller_tensor``): 3 for float16/bfloat16 outputs, else 2;
    3 when the output has fewer than 1000 elements or ``tol >= 2e-2``."""
    n = np.asarray(n_elements, dtype=np.float64)
    base = 3.0 if dtype in ("float16", "bfloat16") else 2.0
    return np.where((n < 1000) | (tol >= 2e-2), 3.0, base)


class DynamoSameRule(Rule):
    """torch dynamo's accuracy rule (``torch._dynamo.utils.same`` with an fp64 reference).

    A run passes when ``torch.allclose(eager, out, atol=tol, rtol=tol)`` (the first try,
    against the eager output), or else when ``rmse(fp64, out) <= m * rmse(fp64, eager) +
    tol / 10``. ``m`` is :func:`dynamo_multiplier` (2, raised to 3 for float16/bfloat16
    outputs, small outputs and large ``tol``) unless ``multiplier`` fixes it. The run
    statistic is the smaller of ``peer_eager_close / tol`` and ``peer_rmse / (m *
    peer_eager_rmse + tol / 10)`` (:data:`PEER_VARIABLES`): above 1 exactly when both fail.
    NaN outputs fail (``equal_nan=False``, ``same``'s default); the case of an eager output
    with NaN where the candidate has none is not modelled.
    """

    family = "eager-relative"
    data_free = True
    unit = "min(allclose-to-eager ratio, RMSE / bound)"
    NEEDS = ("peer_rmse", "peer_eager_rmse", "peer_eager_close")

    def __init__(self, name: str = "dynamo same", tol: float = 1e-3, multiplier: float | None = None):
        if not (tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
        if multiplier is not None and not (multiplier > 0 and math.isfinite(multiplier)):
            raise ValueError(f"multiplier must be a positive number or None, got {multiplier!r}")
        self.name, self.tol, self.multiplier = name, float(tol), multiplier

    def fixed_threshold(self, key: tuple[str, str, str]) -> float:  # noqa: D102
        return 1.0

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        def score(ds: xr.Dataset) -> np.ndarray:
            v = _peer_values(ds, self.name, self.NEEDS)
            dts = np.asarray(ds["dtype"].values).astype(str)
            n = np.asarray(ds["n_elements"].values, dtype=np.float64)
            m = np.empty(dts.size)
            for dt in np.unique(dts):
                sel = dts == dt
                m[sel] = (self.multiplier if self.multiplier is not None
                          else dynamo_multiplier(dt, n[sel], self.tol))
            first = _ratio_each(v["peer_eager_close"], np.full(dts.size, self.tol))
            second = _ratio_each(v["peer_rmse"], m * v["peer_eager_rmse"] + self.tol / 10.0)
            return np.minimum(first, second)

        return Fitted({}, {}, score)

    def describe(self) -> str:  # noqa: D102
        m = "m (3 for fp16/bf16 outputs or < 1000 elements, else 2)" if self.multiplier is None \
            else f"{self.multiplier:g}"
        return (f"torch._dynamo.utils.same: allclose(eager, out, {self.tol:g}, {self.tol:g}) or "
                f"rmse(fp64, out) <= {m} x rmse(fp64, eager) + {self.tol / 10:g}")


class FlashAttentionRule(Rule):
    """FlashAttention's test rule: ``max|out - ref_lp| <= factor * max|eager - ref_lp| + fwd_atol``.

    ``ref_lp`` is the reference in the storage dtype (the tests' ``out_ref``, computed in
    float32 and cast back; here the float64 reference rounded), the eager kernel is the
    same-precision baseline (the tests' ``out_pt``), ``factor`` 2 (3 with softcap in
    FlashAttention 3's tests) and ``fwd_atol = 2 * max|ref_lp + 0.3 - 0.3 - ref_lp|`` in
    the storage dtype. The run statistic is ``peer_max_abs_lp / (factor *
    peer_eager_max_abs_lp + peer_fa_atol)`` (:data:`PEER_VARIABLES`); NaN outputs fail.
    """

    family = "eager-relative"
    data_free = True
    unit = "max |out - ref_lp| / bound"
    NEEDS = ("peer_max_abs_lp", "peer_eager_max_abs_lp", "peer_fa_atol")

    def __init__(self, name: str = "flash-attention 2x eager", factor: float = 2.0):
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"factor must be a positive number, got {factor!r}")
        self.name, self.factor = name, float(factor)

    def fixed_threshold(self, key: tuple[str, str, str]) -> float:  # noqa: D102
        return 1.0

    def fit(self, train, *, budget, confidence, by):  # noqa: D102
        def score(ds: xr.Dataset) -> np.ndarray:
            v = _peer_values(ds, self.name, self.NEEDS)
            return _ratio_each(v["peer_max_abs_lp"], self.factor * v["peer_eager_max_abs_lp"] + v["peer_fa_atol"])

        return Fitted({}, {}, score)

    def describe(self) -> str:  # noqa: D102
        return (f"FlashAttention tests: max|out - ref_lp| <= {self.factor:g} x max|eager - ref_lp| "
                "+ 2 max|ref_lp + 0.3 - 0.3 - ref_lp|")


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
    # the peers' rules; the eager-relative ones need the PEER_VARIABLES in the dataset
    "gpucheck": lambda: GpucheckRule("gpucheck"),
    "dynamo-same": lambda: DynamoSameRule("dynamo-same"),
    "flash-attention": lambda: FlashAttentionRule("flash-attention"),
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
