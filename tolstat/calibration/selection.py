"""Select thresholds under a false-positive budget; the tolerance table.

Step between the fitted models and the checks (dataset -> estimators/scale -> bounds ->
**select** -> table -> check). Semantics (``docs/selection.md``):

* a *check* compares one kernel output with its reference and computes one or more
  *check statistics* (the run's max error, possibly normalised by a noise-scale model,
  and optionally a bias statistic);
* ``fp_budget`` is the largest acceptable probability that a check of a *correct* run
  fails;
* each threshold is an upper confidence bound, at ``confidence``, of the
  ``(1 - budget)`` quantile of its statistic over correct runs. With several statistics
  the budget and the confidence are split (union bound) so that the promise
  ``P(check of a correct run fails) <= fp_budget`` holds with probability
  ``>= confidence`` for the whole check.

Per group the bound is the distribution-free order statistic when there are enough runs
(``n >= ln(1 - confidence) / ln(1 - budget)``), else an extreme-value tail model (GPD
peaks over threshold, with a parametric-bootstrap upper bound of the return level) when
the tail fit is adequate, else :class:`~tolstat._base.util.NotEnoughData` (a ``ValueError``)
saying how many runs are needed. The sample maximum is never returned silently.

The bounds live in :mod:`tolstat.calibration.bounds`, the table in :mod:`tolstat.calibration.table`, the
statistics in :mod:`tolstat.models.statistics`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import xarray as xr

from tolstat._base import validate as _validate
from tolstat._base.util import ANY, GROUP_DIMS, group_rows, rows_by_code
from tolstat._base.validate import unit_interval as _unit
from tolstat._version import __version__
from tolstat.calibration.bounds import (
    Calibration,
    TailOptions,
    conformal_threshold,
    order_statistic_threshold,
    tail_fit,
    tail_threshold,
)
from tolstat._base.inference import split_budget
from tolstat._base.util import NotEnoughData
from tolstat.calibration.forms import CERTIFIED_FORMS, certified_groups
from tolstat.calibration.options import SELECT_METHODS, SelectOptions
from tolstat.dataset.schema import drop_duplicate_runs, run_units, validate
from tolstat.calibration.decision import run_values
from tolstat.models.estimators.orderstat import order_statistic_min_n
from tolstat.models.scale import FORMS, ScaleOptions
from tolstat.models.statistics import MAX_STATISTICS
from tolstat.models.statistics import get as get_statistic
from tolstat.calibration.table import ToleranceTable

__all__ = [
    "calibrate",
    "select",
    "rebudget",
]

_TOP = 256  # largest calibration scores kept per (group, statistic) for p-values


# --------------------------------------------------------------------------- calibration
def calibrate(
    scores: Any,
    budget: float,
    confidence: float = 0.95,
    method: str = "auto",
    *,
    tail: TailOptions | None = None,
    seed: int = 0,
    label: str = "",
) -> Calibration:
    """Upper confidence bound of the ``1 - budget`` quantile of run scores.

    Parameters
    ----------
    scores : array_like
        One check statistic per calibration run (finite, nonnegative).
    budget : float
        Acceptable exceedance probability, in (0, 1).
    confidence : float
        Confidence of the upper bound, in (0, 1).
    method : {"auto", "order_statistic", "conformal", "evt"}
        ``order_statistic``: the distribution-free bound (needs
        ``n >= ln(1-confidence)/ln(1-budget)``). ``conformal``: the split-conformal
        quantile (a *marginal* guarantee, averaged over calibration sets; needs
        ``n >= (1-budget)/budget``). ``evt``: GPD tail with a parametric-bootstrap upper
        bound of the return level (needs ``tail.min_tail_runs`` runs, an adequate tail fit,
        and at most ``tail.max_extrapolation`` times beyond the data, i.e.
        ``1/(budget*n) <= max_extrapolation``): **model-based, no finite-sample
        guarantee**; only when asked for. ``auto``: the order statistic when n
        suffices, else :class:`NotEnoughData` (never the tail model silently).
    tail : TailOptions, optional
        Tail model settings: its adequacy rules (above), threshold rule, and
        ``bound``, the upper bound of the GPD return level. ``conservative`` (default): the return
        level at an upper confidence bound of the shape, ``max(xi_hat, 0) + z*(1 +
        max(xi_hat, 0))/sqrt(k)``, and of the scale, ``sigma_hat * 2k / chi2_{1-g'}(2k)``
        (exact for an exponential tail), each at ``g' = 1 - (1-g)/2``; the return level
        increases in both, so the bound holds with confidence >= g under the GPD model,
        and never assumes a bounded tail (rounding errors usually have one, so this is
        conservative). ``bootstrap``: percentile parametric bootstrap (tighter, but
        measured to under-cover badly with 30-50 exceedances).
    seed : int
        Seed of the parametric bootstrap.
    label : str
        Group name used in error messages.

    Returns
    -------
    Calibration

    Raises
    ------
    NotEnoughData
        Too few runs for every allowed method (a ``ValueError``; the message and
        ``n_needed`` give the runs needed).
    ValueError
        Bad budget/confidence/method, empty/NaN/negative/infinite scores.
    """
    # the budget of one statistic: a table's fp_budget (>= MIN_BUDGET) split over its
    # statistics, so down to MIN_BUDGET / 8
    a = _validate.budget("budget", budget, lo=_validate.MIN_BUDGET / 8)
    g = _unit("confidence", confidence)
    if method not in SELECT_METHODS:
        raise ValueError(f"method must be one of {SELECT_METHODS}, got {method!r}")
    tail = TailOptions() if tail is None else tail
    if not isinstance(tail, TailOptions):
        raise TypeError(f"tail must be a TailOptions, got {type(tail).__name__}")
    where = f"group {label}: " if label else ""
    x = _checked_scores(scores, where)
    n = int(x.size)
    top = np.sort(x)[::-1][:_TOP].copy()
    nmin = order_statistic_min_n(1.0 - a, g)
    fitted = tail_fit(x, tail.tail_fraction, tail.min_exceedances)
    # a rejected tail fit is not kept: no exceedance probability is ever quoted from it
    accepted = fitted.tail if not fitted.why_not else {}
    if method in ("auto", "order_statistic") and n >= nmin:
        return order_statistic_threshold(x, a, g, accepted, top)
    if method == "conformal":
        return conformal_threshold(x, a, g, accepted, top, where)
    if method in ("order_statistic", "auto"):
        extra = ("; method='evt' (SelectOptions(method='evt') in select) gives a model-based bound (no "
                 "finite-sample guarantee), or use the default "
                 "form='auto' of select, which pools exchangeable groups" if method == "auto" else "")
        raise NotEnoughData(f"{where}the order statistic needs n >= {nmin} runs for budget {a:g} at confidence "
                            f"{g:g} (n >= ln(1-confidence)/ln(1-budget)); have n = {n}{extra}", n=n,
                            n_needed=nmin)
    return tail_threshold(x, a, g, fitted, top, tail, seed=seed, where=where)


def _checked_scores(scores: Any, where: str) -> np.ndarray:
    """Calibration scores as float64, rejecting empty, NaN, infinite and negative ones."""
    x = np.asarray(scores, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"{where}no calibration runs (empty group)")
    if np.isnan(x).any():
        raise ValueError(f"{where}{int(np.isnan(x).sum())} calibration score(s) are NaN")
    if np.isinf(x).any():
        raise ValueError(
            f"{where}{int(np.isinf(x).sum())} calibration run(s) have infinite error (NaN/Inf in "
            "the kernel output): calibration data must come from correct runs"
        )
    if (x < 0).any():
        raise ValueError(f"{where}negative calibration scores")
    return x


# --------------------------------------------------------------------------- select
def _group_keys(ds: xr.Dataset, by: Sequence[str]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    cols = [np.asarray(ds[name].values).astype(str) if name in by else np.full(ds.sizes["run"], ANY)
            for name in GROUP_DIMS]
    g = group_rows(cols)
    return [tuple(str(v) for v in k) for k in g.keys()], g.codes


def select(
    errors_or_fit: xr.Dataset,
    *,
    fp_budget: float,
    confidence: float = 0.95,
    form: str | None = "auto",
    statistic: str | Sequence[str] = "max_abs",
    by: Sequence[str] = ("op", "dtype", "hardware"),
    cluster: str | None = None,
    on_error: str = "raise",
    options: SelectOptions | None = None,
) -> ToleranceTable:
    """Thresholds per (op, dtype, hardware) that keep a false-positive budget.

    Parameters
    ----------
    errors_or_fit : xarray.Dataset
        An error dataset of *correct* runs (``docs/schema.md``).
    fp_budget : float
        Largest acceptable probability that a check of a correct run fails, in (0, 1).
        For a suite of N checks use :func:`~tolstat._base.inference.split_budget`.
    confidence : float, default 0.95
        Confidence that the promise holds (the thresholds are upper confidence bounds).
    form : {"auto", "operator", None, "allclose", "size_aware", "normalised", "baseline"}
        What the check compares (its *decision value*, :mod:`tolstat.calibration.decision`; 0 for a
        correctly rounded output). ``"auto"`` (default): the operator combined score
        ``op_score`` when the dataset has operator statistics (collected with
        ``magnitude=``), else the better of ``allclose`` and ``size_aware`` chosen on
        fitting runs not used for the threshold; ``"operator"``: the combined score,
        required; ``None``: the plain ``statistic``; the other names: that noise-scale
        model (:mod:`tolstat.models.scale`), fitted on a part of the units that does not set the
        threshold (``"max_score"``, needs ``statistic="max_abs"``). A group with too few
        units to fit a scale and keep the order statistic's minimum uses the fit-free
        scale :meth:`tolstat.models.ScaleModel.fit_free`. The table records the choice and why.
        With ``options.method`` ``"auto"``/``"order_statistic"`` and one statistic, every form
        is calibrated by one engine (:func:`tolstat.calibration.engine.certify`): the
        distribution-free order statistic on independent units, pooling across
        exchangeable groups, an exact path for exact ops; never a tail model.
        ``statistic`` with ``"bias"``, ``SelectOptions(method="conformal")`` and
        ``SelectOptions(method="evt")`` are calibrated per statistic by :func:`calibrate`
        (``options.budget_split``, ``options.tail``).
    statistic : str or sequence of str, default "max_abs"
        The max-error statistic (``"max_abs"``, ``"max_ulp"`` or ``"max_rel"``),
        optionally with ``"bias"`` (e.g. ``("max_abs", "bias")``): the budget and
        confidence are then split between the statistics (``options.budget_split``).
    by : sequence of str, default ("op", "dtype", "hardware")
        Grouping; leave out ``"hardware"`` to calibrate one ``"*"`` entry over all
        hardware (``op`` and ``dtype`` are required).
    cluster : str, optional
        A run label (e.g. ``"case"``: the same inputs through several variants) whose runs
        form one unit. Runs that share a reference (the same inputs, recorded as a
        fingerprint at collection) are one unit whether or not a label is declared; the
        two combine (:func:`tolstat.dataset.schema.run_units`). The promise counts units, not runs.
    on_error : {"raise", "skip"}
        ``"skip"`` keeps groups with too few runs (:class:`NotEnoughData`) in the table
        with a NaN threshold and the reason (looking them up raises); other errors
        (bad data, missing covariates) are raised.
    options : SelectOptions, optional
        The threshold method, the budget split between statistics, pooling, the
        noise-scale and tail-model settings and the seed: see
        :class:`~tolstat.calibration.options.SelectOptions` (default ``SelectOptions()``).

    Returns
    -------
    ToleranceTable

    Raises
    ------
    NotEnoughData
        A group has too few runs (with ``on_error="raise"``; the message names the
        group and the runs needed).
    ValueError
        Bad budget/confidence/statistic/form; NaN or infinite calibration data.
    TypeError
        ``options`` is not a :class:`~tolstat.calibration.options.SelectOptions`.

    Examples
    --------
    >>> import numpy as np, tolstat
    >>> from tolstat import select
    >>> def kern(x): return (x.astype(np.float16) * np.float16(3)).astype(np.float16)
    >>> def ref(x): return x.astype(np.float16).astype(np.float64) * 3
    >>> ds = tolstat.collect(kern, ref, lambda rng: tolstat.Inputs(args=(rng.standard_normal(64),)),
    ...                      op="scale3", dtype="float16", runs=400, hardware="cpu")
    >>> t = select(ds, fp_budget=0.01, form="allclose")
    >>> t.entry("scale3", "float16").statistics["max_score"].method
    'order_statistic'
    >>> t = select(ds, fp_budget=0.01, form=None, options=tolstat.SelectOptions(method="conformal"))
    >>> t.entry("scale3", "float16").statistics["max_abs"].method
    'conformal'
    """
    o = SelectOptions() if options is None else options
    if not isinstance(o, SelectOptions):
        raise TypeError(f"options must be a SelectOptions, got {type(o).__name__}")
    plan = _plan(errors_or_fit, fp_budget, confidence, o.method, statistic, form, by, o.budget_split, on_error)
    ds = drop_duplicate_runs(validate(errors_or_fit))
    keys, inv = _group_keys(ds, plan.by)
    if plan.engine:
        groups, name = certified_groups(ds, keys, inv, form=form, a=plan.a, g=plan.g, cluster=cluster,
                                        on_error=on_error, statistic=plan.max_stat, options=o)
        plan = dataclasses.replace(plan, names=[name], a_each=plan.a, g_each=plan.g)
    else:
        units = run_units(ds, cluster, groups=inv).ids
        groups = [_select_group(ds.isel(run=idx), key, plan, o.scale, o.tail, o.seed, units[idx])
                  for key, idx in zip(keys, rows_by_code(inv, len(keys)))]
    settings = {"fp_budget": plan.a, "confidence": plan.g, "method": o.method, "statistic": plan.requested,
                "form": form, "by": list(plan.by), "budget_split": o.budget_split, "seed": o.seed,
                "cluster": cluster, "pooling": o.pooling, "tail": o.tail.to_dict(), "scale": o.scale.to_dict()}
    prov = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tolstat_version": __version__,
        "function": "tolstat.select",
        "settings": settings,
        "errors_provenance": json.loads(ds.attrs.get("provenance", "[]")),
        "n_runs": int(ds.sizes["run"]),
    }
    meta = {"fp_budget": plan.a, "confidence": plan.g, "form": form, "statistics": plan.names,
            "budget_split": o.budget_split, "provenance": prov}
    return ToleranceTable.from_groups(groups, meta)


@dataclass(frozen=True)
class _Plan:
    """Validated settings of one :func:`select` call."""

    a: float
    g: float
    method: str
    requested: list[str]
    max_stat: str
    form: str | None
    names: list[str]
    a_each: float
    g_each: float
    by: tuple[str, ...]
    budget_split: str
    on_error: str
    #: calibrated by the certified engine (tolstat.calibration.engine): every form with the order
    #: statistic on one statistic; the others (bias, conformal, evt) by tolstat.calibration.bounds
    engine: bool = True


def _plan(ds: Any, fp_budget: float, confidence: float, method: str, statistic: str | Sequence[str],
          form: str | None, by: Sequence[str], budget_split: str, on_error: str) -> _Plan:
    a = _validate.budget("fp_budget", fp_budget)
    g = _unit("confidence", confidence)
    stats_req = [statistic] if isinstance(statistic, str) else list(statistic)
    max_stats = [s for s in stats_req if s != "bias"]
    if len(max_stats) != 1 or any(s not in MAX_STATISTICS + ("bias",) for s in stats_req) \
            or len(set(stats_req)) != len(stats_req):
        raise ValueError(f"statistic must be one of 'max_abs', 'max_ulp', 'max_rel', optionally with 'bias', "
                         f"got {statistic!r}")
    if form is not None and form not in FORMS + CERTIFIED_FORMS:
        raise ValueError(f"form must be None or one of {CERTIFIED_FORMS + FORMS}, got {form!r}")
    if form in FORMS and max_stats[0] != "max_abs":
        raise ValueError(f"form={form!r} normalises the absolute error: use statistic='max_abs' "
                         f"(got {max_stats[0]!r})")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if form in CERTIFIED_FORMS and (stats_req != ["max_abs"] or method != "auto"):
        raise ValueError(f"statistic={statistic!r} and method={method!r} apply to form=None and the scale forms; "
                         f"form={form!r} calibrates its own score with tolstat.calibration.engine: pass form=None (or a scale "
                         "form) to use them")
    by = tuple(by)
    if "op" not in by or "dtype" not in by or not set(by) <= set(GROUP_DIMS):
        raise ValueError(f"by must contain 'op' and 'dtype' (and optionally 'hardware'), got {by!r}")
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"select needs an error dataset (xarray.Dataset), got {type(ds).__name__}")
    if "run" not in ds.dims:
        raise ValueError("select needs an error dataset with a 'run' dimension (see docs/schema.md); "
                         "results of tolstat.models.estimators.fit carry no budget and cannot be re-calibrated")
    names = ["max_score" if form in FORMS else max_stats[0]] + (["bias"] if "bias" in stats_req else [])
    m = len(names)
    # the statistics of one run are not independent: "sidak" is refused by split_budget
    a_each = split_budget(a, m, method=budget_split) if m > 1 else a
    g_each = 1.0 - (1.0 - g) / m
    engine = form in CERTIFIED_FORMS or (method in ("auto", "order_statistic") and m == 1)
    return _Plan(a, g, method, stats_req, max_stats[0], form, names, a_each, g_each, by, budget_split, on_error,
                 engine)


def _unit_max(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per unit the largest value of its runs (conservative for every member run)."""
    u, inv = np.unique(ids, return_inverse=True)
    if u.size == ids.size:
        return x
    out = np.full(u.size, -np.inf)
    np.maximum.at(out, inv.ravel(), x)
    return out


def _select_group(sub: xr.Dataset, key: tuple[str, ...], plan: _Plan, scale: ScaleOptions, tail: TailOptions,
                  seed: int, units: np.ndarray) -> dict[str, Any]:
    """The table entry (JSON layout) of one group of the tolstat.calibration.bounds path (bias, conformal, evt)."""
    label = "(" + ", ".join(key) + ")"
    entry: dict[str, Any] = {"op": key[0], "dtype": key[1], "hardware": key[2], "n": int(sub.sizes["run"]),
                             "n_inexact": 0, "scale": None, "statistics": {}}
    try:
        model = None
        if plan.form is not None:
            model = scale.fit(sub, plan.form, seed=seed)
            entry["scale"] = model.to_dict()
        for name in plan.names:
            stat = get_statistic(name)
            res = stat.run_scores(sub, model)
            if stat.kind == "max":
                entry["n_inexact"] = res.n_inexact
            x = _unit_max(run_values(sub, name, model), units)
            entry["certificate"] = {"form": plan.form or "plain", "method": plan.method, "n_scores": int(x.size),
                                    "units": {"n_runs": int(units.size), "n_units": int(x.size),
                                              "by": "declared cluster and reference fingerprint"},
                                    "guarantee": ""}
            if "n_elements" in sub and sub.sizes["run"]:
                # the largest output calibrated: a larger one's decision is carried
                # (tolstat.calibration.decision.beyond_calibrated_size)
                entry["certificate"]["n_elements_max"] = int(np.max(sub["n_elements"].values))
            cal = calibrate(x, plan.a_each, plan.g_each, plan.method, tail=tail, seed=seed,
                            label=label + f" statistic {name}")
            entry["statistics"][name] = _stat_dict(cal, plan, res.n_inexact)
    except NotEnoughData as exc:
        if plan.on_error == "raise":
            raise
        for name in plan.names:
            entry["statistics"].setdefault(name, {
                "threshold": math.nan, "estimate": math.nan, "budget": plan.a_each, "confidence": plan.g_each,
                "method": "refused", "reason": str(exc), "tail": {}, "top_scores": [],
            })
    return entry


def _stat_dict(cal: Calibration, plan: _Plan, n_inexact: int) -> dict[str, Any]:
    reason = cal.reason
    m = len(plan.names)
    if m > 1:
        reason += (f"; budget {plan.a:g} split over {m} statistics ({plan.budget_split}): {plan.a_each:.6g} "
                   f"each at confidence {plan.g_each:.6g}")
    if n_inexact:
        reason += f"; {n_inexact} run(s) had a truncated Pareto front: their scores are lower bounds"
    return {"threshold": cal.threshold, "estimate": cal.estimate, "budget": cal.budget,
            "confidence": cal.confidence, "method": cal.method, "reason": reason,
            "tail": cal.tail, "top_scores": cal.top.tolist()}


def rebudget(table: ToleranceTable, fp_budget: float, *, why: str = "") -> ToleranceTable:
    """The table with every threshold re-selected for a smaller false-positive budget.

    Each threshold is the order statistic at the new budget (same confidence), on the
    calibration scores the threshold was certified on: the table stores the largest of
    them and their number (``certificate["n_scores"]``: independent units, not runs);
    the scores below the stored ones are taken at the smallest stored score, which can
    only raise the threshold (exact when the new rank lies among the stored scores).
    A threshold never drops below the table's own. Statistics of a table with several
    statistics keep their share of the budget.

    A group whose threshold is not an order statistic of its own scores (pooled, exact,
    conformal, tail-model groups), or that has too few scores for the new budget, gets a
    NaN threshold with the reason (looking it up raises): the table never records a
    budget it did not apply. Recalibrate those with ``select(fp_budget=...)``.

    Parameters
    ----------
    table : ToleranceTable
    fp_budget : float
        The new per-check budget, at most the table's.
    why : str
        Prefix of the new reasons (e.g. the suite budget it comes from).

    Raises
    ------
    ValueError
        A budget larger than the table's.
    """
    a = _validate.budget("fp_budget", fp_budget, lo=_validate.MIN_BUDGET / 8)
    if a > table.fp_budget:
        raise ValueError(f"fp_budget={a:g} is larger than the table's fp_budget {table.fp_budget:g}: a table can "
                         "only be re-budgeted to a smaller budget (calibrate again for a larger one)")
    ds = table.data.copy(deep=True)
    factor = a / table.fp_budget
    thr, bud, meth = ds["threshold"].values, ds["budget"].values, ds["method"].values.astype(object)
    reason = ds["reason"].values.astype(object)
    for i in range(ds.sizes["group"]):
        cj = str(ds["certificate_json"].values[i]) if "certificate_json" in ds else ""
        n = int(json.loads(cj).get("n_scores") or 0) if cj else int(ds["n"].values[i])
        for j in range(ds.sizes["statistic"]):
            if math.isnan(thr[i, j]):
                continue
            b, g = float(bud[i, j]) * factor, float(ds["stat_confidence"].values[i, j])
            top = ds["top_scores"].values[i, j]
            top = np.sort(top[~np.isnan(top)])[::-1]
            pre = f"{why}: " if why else ""
            if meth[i, j] != "order_statistic" or top.size == 0 or n < top.size:
                thr[i, j] = math.nan
                reason[i, j] = (f"{pre}not re-budgeted to {b:.3g}: its threshold ({meth[i, j]}) is not an order "
                                "statistic of its own stored calibration scores; recalibrate with "
                                f"select(fp_budget={b:.3g})")
            else:
                pseudo = np.concatenate([top, np.full(n - top.size, top[-1])])
                try:
                    cal = calibrate(pseudo, b, g, method="order_statistic")
                except NotEnoughData as exc:
                    thr[i, j] = math.nan
                    reason[i, j] = f"{pre}{exc} (calibration units of this group: {n})"
                else:
                    thr[i, j] = max(cal.threshold, float(thr[i, j]))
                    reason[i, j] = (f"{pre}re-budgeted from {float(bud[i, j]):.3g}: {cal.reason}; scores below the "
                                    f"{top.size} stored largest taken at the smallest of them")
            bud[i, j] = b
    ds["threshold"].values[...] = thr
    ds["budget"].values[...] = bud
    ds["reason"] = (("group", "statistic"), reason.astype(str))
    ds.attrs["fp_budget"] = a
    prov = json.loads(ds.attrs.get("provenance", "{}"))
    prov["rebudget"] = {"fp_budget": a, "table_fp_budget": table.fp_budget, "why": why}
    ds.attrs["provenance"] = json.dumps(prov, sort_keys=True)
    return type(table)(ds)
