"""Select thresholds under a false-positive budget; the tolerance table.

Step between the fitted models and the checks (errors -> estimators/scale -> **select**
-> check). Semantics (``docs/selection.md``):

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
the tail fit is adequate, else a ``ValueError`` saying how many runs are needed. The
sample maximum is never returned silently.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr
from scipy import stats as _st

from ._version import __version__
from .errors import validate
from .estimators import evt as _evt
from .estimators.bootstrap import bootstrap_return_level_bound
from .estimators.orderstat import conformal_bound, conformal_min_n, order_statistic_bound, order_statistic_min_n
from .scale import FORMS, ScaleModel, bias_scores, fit_scale, run_scores

__all__ = [
    "TABLE_SCHEMA",
    "STATISTICS",
    "SELECT_METHODS",
    "Calibration",
    "StatEntry",
    "ToleranceEntry",
    "ToleranceTable",
    "split_budget",
    "calibrate",
    "select",
    "load_table",
]

TABLE_SCHEMA = 1
#: statistics a table can hold
STATISTICS = ("max_abs", "max_ulp", "max_rel", "max_score", "bias")
SELECT_METHODS = ("auto", "order_statistic", "conformal", "evt")
_TOP = 256  # largest calibration scores kept per (group, statistic) for p-values
ANY = "*"


# --------------------------------------------------------------------------- budget
def _unit(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {v!r}") from None
    if not (0.0 < f < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {v!r}")
    return f


def split_budget(suite_budget: float, n_checks: int, *, method: str = "sidak") -> float:
    """Per-check false-positive budget so that a suite of ``n_checks`` keeps ``suite_budget``.

    Parameters
    ----------
    suite_budget : float
        Acceptable probability that *any* of the checks of a correct suite fails.
    n_checks : int
        Number of checks in the suite.
    method : {"sidak", "bonferroni"}
        ``"bonferroni"``: ``a / N`` (union bound, valid under any dependence);
        ``"sidak"``: ``1 - (1 - a)**(1/N)`` (exact for independent checks, slightly
        larger; valid for positively dependent ones).

    Returns
    -------
    float

    Examples
    --------
    >>> split_budget(0.01, 100, method="bonferroni")
    0.0001
    >>> round(split_budget(0.01, 100), 8)
    0.0001005
    """
    a = _unit("suite_budget", suite_budget)
    if int(n_checks) != n_checks or n_checks < 1:
        raise ValueError(f"n_checks must be a positive integer, got {n_checks!r}")
    n = int(n_checks)
    if method == "bonferroni":
        return a / n
    if method == "sidak":
        return -math.expm1(math.log1p(-a) / n)
    raise ValueError(f"method must be 'sidak' or 'bonferroni', got {method!r}")


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class Calibration:
    """A threshold for one statistic of one group and how it was obtained.

    Attributes
    ----------
    threshold : float
        Upper confidence bound of the ``1 - budget`` quantile of the statistic.
    estimate : float
        Point estimate of that quantile (empirical 'higher' quantile, or GPD return
        level).
    budget, confidence : float
        The per-statistic budget and confidence the bound was made for.
    method : str
        ``"order_statistic"``, ``"conformal"`` or ``"evt"``.
    reason : str
        Why this method, with the numbers.
    n : int
        Calibration runs.
    tail : dict
        GPD tail fit of the scores (``u, sigma, xi, zeta``; NaN when not fitted), used
        for probability estimates of errors beyond the data.
    top : numpy.ndarray
        The largest calibration scores, descending (at most 256).
    """

    threshold: float
    estimate: float
    budget: float
    confidence: float
    method: str
    reason: str
    n: int
    tail: dict[str, float] = field(default_factory=dict)
    top: np.ndarray = field(default_factory=lambda: np.empty(0))


_NAN_TAIL = {"u": math.nan, "sigma": math.nan, "xi": math.nan, "zeta": math.nan, "gof_p": math.nan}


def _tail_fit(x: np.ndarray, tail_fraction: float, min_exc: int) -> tuple[dict[str, float], str]:
    """GPD fit of the top of ``x`` and a KS goodness-of-fit p-value; (tail, why-not)."""
    if x.size < min_exc + 1:
        return dict(_NAN_TAIL), f"n = {x.size} < {min_exc + 1} runs needed for a tail fit"
    fit = _evt.pot_fit(x, 0.5 / x.size, tail_fraction=tail_fraction, min_exceedances=min_exc)
    xs = np.sort(x)
    y = xs[xs > fit["u"]] - fit["u"]
    tail = {"u": fit["u"], "sigma": fit["sigma"], "xi": fit["xi"], "zeta": fit["zeta"], "gof_p": math.nan}
    nd = np.unique(y).size
    if nd < 10:
        return tail, (f"only {nd} distinct values above the tail threshold (lattice or ties): "
                      "a continuous GPD tail does not describe them")
    if not fit["sigma"] > 0:
        return tail, "degenerate tail (zero scale)"
    p = float(_st.kstest(y, _st.genpareto(fit["xi"], 0.0, fit["sigma"]).cdf).pvalue)
    tail["gof_p"] = p
    if p < 0.05:
        return tail, f"GPD tail rejected by a KS test (p = {p:.3g} < 0.05)"
    if fit["xi"] >= 1:
        return tail, f"tail too heavy (xi = {fit['xi']:.3g} >= 1: infinite mean)"
    return tail, ""


def calibrate(
    scores: Any,
    budget: float,
    confidence: float = 0.95,
    method: str = "auto",
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    min_tail_runs: int = 50,
    max_extrapolation: float = 1000.0,
    tail_fraction: float = 0.1,
    min_exceedances: int = 30,
    tail_bound: str = "conservative",
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
        bound of the return level (needs ``min_tail_runs`` runs, an adequate tail fit,
        and at most ``max_extrapolation`` times beyond the data, i.e.
        ``1/(budget*n) <= max_extrapolation``). ``auto``: order statistic when n
        suffices, else evt when adequate, else an error.
    n_resamples, seed : int
        Parametric bootstrap settings.
    min_tail_runs, max_extrapolation, tail_fraction, min_exceedances :
        Adequacy rules of the tail model (above) and its threshold rule.
    tail_bound : {"conservative", "bootstrap"}
        Upper bound of the GPD return level. ``conservative`` (default): the return
        level at an upper confidence bound of the shape, ``max(xi_hat, 0) + z*(1 +
        max(xi_hat, 0))/sqrt(k)``, and of the scale, ``sigma_hat * 2k / chi2_{1-g'}(2k)``
        (exact for an exponential tail), each at ``g' = 1 - (1-g)/2``; the return level
        increases in both, so the bound holds with confidence >= g under the GPD model,
        and never assumes a bounded tail (rounding errors usually have one, so this is
        conservative). ``bootstrap``: percentile parametric bootstrap (tighter, but
        measured to under-cover badly with 30-50 exceedances).
    label : str
        Group name used in error messages.

    Returns
    -------
    Calibration

    Raises
    ------
    ValueError
        Bad budget/confidence, empty/NaN/negative/infinite scores, or too few runs for
        every allowed method (the message names the runs needed).
    """
    a = _unit("fp_budget", budget)
    g = _unit("confidence", confidence)
    if method not in SELECT_METHODS:
        raise ValueError(f"method must be one of {SELECT_METHODS}, got {method!r}")
    if tail_bound not in ("conservative", "bootstrap"):
        raise ValueError(f"tail_bound must be 'conservative' or 'bootstrap', got {tail_bound!r}")
    where = f"group {label}: " if label else ""
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
    n = int(x.size)
    p = 1.0 - a
    top = np.sort(x)[::-1][:_TOP].copy()
    nmin = order_statistic_min_n(p, g)
    tail, why_not = _tail_fit(x, tail_fraction, min_exceedances)
    est_emp = float(np.quantile(x, p, method="higher"))
    if method in ("auto", "order_statistic") and n >= nmin:
        bound, rank, _ = order_statistic_bound(x, p, g)
        reason = (f"order statistic: n = {n} >= {nmin} runs needed for the {p:.10g}-quantile at "
                  f"{g:.10g} confidence; threshold = {int(rank[0])}-th smallest of {n} scores")
        if float(bound[0]) == 0.0:
            reason += " (all calibration scores at this rank are 0: any error fails)"
        return Calibration(float(bound[0]), est_emp, a, g, "order_statistic", reason, n, tail, top)
    if method == "conformal":
        cmin = conformal_min_n(a)
        if n < cmin:
            raise ValueError(f"{where}n = {n} runs are too few for a split-conformal bound at budget {a:g}: "
                             f"need n >= {cmin}")
        bound, rank, _ = conformal_bound(x, a)
        reason = (f"split conformal: {int(rank[0])}-th smallest of {n} scores; marginal guarantee "
                  "P(new score > threshold) <= budget averaged over calibration sets (no confidence level)")
        return Calibration(float(bound[0]), est_emp, a, g, "conformal", reason, n, tail, top)
    need = (f"the order statistic needs n >= {nmin} runs for budget {a:g} at confidence {g:g} "
            f"(n >= ln(1-confidence)/ln(1-budget)); have n = {n}")
    if method == "order_statistic":
        raise ValueError(f"{where}{need}")
    # tail model
    problems = []
    if n < min_tail_runs:
        problems.append(f"n = {n} < {min_tail_runs} runs required for a tail model")
    extrap = 1.0 / (a * n)
    if extrap > max_extrapolation:
        problems.append(f"budget {a:g} lies {extrap:.3g}x beyond the data (1/(budget*n)), more than "
                        f"max_extrapolation = {max_extrapolation:g}")
    if why_not:
        problems.append(why_not)
    if problems:
        raise ValueError(
            f"{where}{need}; the tail model was refused: {'; '.join(problems)}. Collect at least "
            f"{nmin} runs, or raise fp_budget"
        )
    k = max(int(round(tail["zeta"] * n)), 1)
    est = float(_evt.gpd_return_level(tail["u"], tail["sigma"], tail["xi"], tail["zeta"], a)) \
        if a < tail["zeta"] else est_emp
    if tail_bound == "bootstrap":
        r = bootstrap_return_level_bound(x, a, confidence=g, n_resamples=n_resamples, method="percentile",
                                         resampling="parametric", seed=seed, tail_fraction=tail_fraction,
                                         min_exceedances=min_exceedances)
        bound = float(r.bound)
        how = (f"{g:g} parametric-bootstrap percentile upper bound ({n_resamples} resamples; known to "
               "under-cover for small tails)")
    else:
        bound, how = _conservative_tail_bound(x, tail, k, a, g)
    thr = max(bound, float(x.max()))
    reason = (f"evt: n = {n} < {nmin} runs for the order statistic; GPD tail over the top "
              f"{k} of {n} scores (xi = {tail['xi']:.3g}, KS p = {tail['gof_p']:.2g}); "
              f"threshold = {how} of the return level at exceedance probability {a:g} (point estimate "
              f"{est:.6g}), extrapolating {extrap:.3g}x beyond the data")
    return Calibration(thr, est, a, g, "evt", reason, n, tail, top)


def _conservative_tail_bound(x: np.ndarray, tail: Mapping[str, float], k: int, q: float,
                             g: float) -> tuple[float, str]:
    """Return level at upper confidence bounds of xi and sigma (see :func:`calibrate`)."""
    u, zeta = float(tail["u"]), float(tail["zeta"])
    g2 = 1.0 - (1.0 - g) / 2.0
    z = float(_st.norm.ppf(g2))
    xs = np.sort(x)
    y = xs[xs > u] - u
    k = int(y.size)
    xi0 = max(float(tail["xi"]), 0.0)
    sigma0 = float(tail["sigma"]) if float(tail["xi"]) > 0 else float(np.mean(y))
    xi_u = xi0 + z * (1.0 + xi0) / math.sqrt(k)
    sigma_u = sigma0 * 2.0 * k / float(_st.chi2.ppf(1.0 - g2, 2 * k))
    rl = float(_evt.gpd_return_level(u, sigma_u, xi_u, zeta, q))
    how = (f"return level at upper {g2:.4g} bounds of the shape (xi <= {xi_u:.3g}, never assuming a "
           f"bounded tail) and of the scale (sigma <= {sigma_u:.4g})")
    return rl, how


def exceedance_probability(value: float, cal: "StatEntry | Calibration") -> tuple[float, str]:
    """Estimated probability that a correct run's statistic is ``>= value``.

    From the empirical calibration distribution inside the data; from the GPD tail fit
    beyond the largest calibration score (with a note), or ``< 1/(n+1)`` with no tail.
    """
    n = int(cal.n)
    top = np.asarray(cal.top, dtype=np.float64)
    top = top[~np.isnan(top)]
    if not np.isfinite(value):
        return 0.0, "non-finite output (NaN/Inf): never produced by the correct calibration runs"
    mx = float(top[0]) if top.size else math.nan
    if top.size and value <= mx:
        if value >= top[-1] or top.size == n:
            k = int(np.sum(top >= value))
            return k / n, f"empirical: {k} of {n} calibration runs reached this value"
        return top.size / n, f"empirical: more than {top.size} of {n} calibration runs reached this value"
    t = cal.tail
    u, s, xi, z = (float(t.get(k, math.nan)) for k in ("u", "sigma", "xi", "zeta"))
    beyond = f"beyond the data (the largest of {n} calibration scores is {mx:.4g})"
    if np.isfinite(u) and s > 0 and value > u:
        y = value - u
        if abs(xi) < 1e-12:
            pr = z * math.exp(-y / s)
        else:
            base = 1.0 + xi * y / s
            pr = 0.0 if base <= 0 else z * base ** (-1.0 / xi)
        if pr == 0.0:
            return 0.0, (f"{beyond}; above the endpoint {u - s / xi:.4g} of the fitted bounded GPD tail "
                         f"(xi = {xi:.3g}): the model gives no correct run this large")
        return pr, f"{beyond}; GPD tail extrapolation (xi = {xi:.3g})"
    return 1.0 / (n + 1), f"{beyond}; no tail model: probability < 1/(n+1)"


# --------------------------------------------------------------------------- table
@dataclass(frozen=True)
class StatEntry:
    """Threshold of one statistic in one group of a :class:`ToleranceTable`."""

    statistic: str
    threshold: float
    estimate: float
    budget: float
    confidence: float
    method: str
    reason: str
    n: int
    tail: dict[str, float]
    top: np.ndarray


@dataclass(frozen=True)
class ToleranceEntry:
    """What a check of one (op, dtype, hardware) needs, found by :meth:`ToleranceTable.entry`.

    Attributes
    ----------
    op, dtype, hardware : str
        The group matched (``hardware`` may be ``"*"``).
    requested_hardware : str or None
        The hardware asked for.
    fallback : str
        How the group was found (``"exact"``, ``"any hardware"``, ``"only hardware"``,
        ``"default op"``).
    n : int
        Calibration runs.
    statistics : dict
        ``{name: StatEntry}``; the first is the max-error statistic.
    scale : ScaleModel or None
        Noise-scale model of ``max_score``.
    fp_budget, confidence : float
        The promise of the whole check.
    """

    op: str
    dtype: str
    hardware: str
    requested_hardware: str | None
    fallback: str
    n: int
    statistics: dict[str, StatEntry]
    scale: ScaleModel | None
    fp_budget: float
    confidence: float

    @property
    def max_statistic(self) -> str:
        """Name of the max-error statistic (``max_abs``, ``max_ulp``, ``max_rel``, ``max_score``)."""
        return next(s for s in self.statistics if s != "bias")

    def allclose(self, covariates: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """``(atol, rtol)`` equivalent of the max-error threshold for one check.

        ``max_abs``: ``(c, 0)``; ``max_rel``: ``(c*rel_floor, c)`` approximately (the
        exact rule is ``|d| <= c*max(|ref|, rel_floor)``); ``max_score``: ``c`` times
        the scale model's pair at ``covariates``.

        Raises
        ------
        ValueError
            ``max_ulp`` or a baseline-relative scale (no allclose form), or missing
            covariates.
        """
        name = self.max_statistic
        c = self.statistics[name].threshold
        if name == "max_abs":
            return float(c), 0.0
        if name == "max_rel":
            from ._dtypes import target_dtype

            return float(c * target_dtype(self.dtype).tiny), float(c)
        if name == "max_ulp":
            raise ValueError("a max_ulp threshold has no (atol, rtol) form; use tolstat.check")
        assert self.scale is not None
        at, rt = self.scale.allclose_pair(covariates)
        return float(c * at), float(c * rt)


def _f(v: Any) -> Any:
    """Float for JSON: repr-exact numbers, non-finite as strings."""
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _uf(v: Any) -> float:
    return float(v)  # float("inf"), float("nan") parse the string forms


class ToleranceTable:
    """Calibrated thresholds per (op, dtype, hardware), backed by an ``xarray.Dataset``.

    Build with :func:`select`; read with :func:`load_table`. ``table.data`` is the
    dataset: dims ``group`` (coords ``op``, ``dtype``, ``hardware``), ``statistic`` and
    ``rank``; variables ``threshold``, ``estimate``, ``budget``, ``stat_confidence``,
    ``method``, ``reason``, ``tail_u/sigma/xi/zeta/gof_p``, ``top_scores`` (largest
    calibration scores), ``n``, ``scale_atol``, ``scale_rtol``, ``scale_json`` (the full
    scale model); attrs ``fp_budget``, ``confidence``, ``form``, ``statistics``,
    ``budget_split``, ``provenance``, ``tolstat_table`` (schema version).

    Lookup (:meth:`entry`) falls back, in this declared order: exact hardware ->
    hardware ``"*"`` (a table calibrated over all hardware) -> the only hardware of that
    (op, dtype) when no hardware was asked for -> op ``"*"`` (a declared default for
    the dtype) with the same hardware rules. Anything else is a ``KeyError`` listing the
    groups available.
    """

    def __init__(self, data: xr.Dataset):
        if int(data.attrs.get("tolstat_table", -1)) != TABLE_SCHEMA:
            raise ValueError(f"not a tolstat tolerance table (schema {data.attrs.get('tolstat_table')!r}, "
                             f"expected {TABLE_SCHEMA})")
        self.data = data

    # ---- construction
    @classmethod
    def from_groups(cls, groups: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> "ToleranceTable":
        """Build from group dicts (the JSON layout) and table metadata."""
        if not groups:
            raise ValueError("a tolerance table needs at least one group")
        statistics = list(meta["statistics"])
        G, S = len(groups), len(statistics)
        K = max(1, max(len(g["statistics"][s].get("top_scores", [])) for g in groups for s in statistics))
        f64 = lambda: np.full((G, S), np.nan)  # noqa: E731
        thr, est, bud, conf = f64(), f64(), f64(), f64()
        tails = {k: f64() for k in ("u", "sigma", "xi", "zeta", "gof_p")}
        meth = np.empty((G, S), dtype=object)
        reas = np.empty((G, S), dtype=object)
        top = np.full((G, S, K), np.nan)
        for i, g in enumerate(groups):
            for j, s in enumerate(statistics):
                e = g["statistics"][s]
                thr[i, j] = _uf(e["threshold"])
                est[i, j] = _uf(e["estimate"])
                bud[i, j] = _uf(e["budget"])
                conf[i, j] = _uf(e["confidence"])
                meth[i, j] = str(e["method"])
                reas[i, j] = str(e["reason"])
                for k in tails:
                    tails[k][i, j] = _uf(e.get("tail", {}).get(k, "nan"))
                ts = [_uf(v) for v in e.get("top_scores", [])]
                top[i, j, : len(ts)] = ts
        scales = [g.get("scale") for g in groups]
        gdim = ("group",)
        ds = xr.Dataset(
            {
                "n": (gdim, np.array([int(g["n"]) for g in groups], dtype=np.int64)),
                "n_inexact": (gdim, np.array([int(g.get("n_inexact", 0)) for g in groups], dtype=np.int64)),
                "threshold": (("group", "statistic"), thr),
                "estimate": (("group", "statistic"), est),
                "budget": (("group", "statistic"), bud),
                "stat_confidence": (("group", "statistic"), conf),
                "method": (("group", "statistic"), meth.astype(str)),
                "reason": (("group", "statistic"), reas.astype(str)),
                **{f"tail_{k}": (("group", "statistic"), v) for k, v in tails.items()},
                "top_scores": (("group", "statistic", "rank"), top),
                "scale_atol": (gdim, np.array([_uf(s["atol"]) if s else np.nan for s in scales])),
                "scale_rtol": (gdim, np.array([_uf(s["rtol"]) if s else np.nan for s in scales])),
                "scale_json": (gdim, np.array([json.dumps(s, sort_keys=True) if s else "" for s in scales],
                                              dtype=str)),
            },
            coords={
                "op": (gdim, np.array([str(g["op"]) for g in groups], dtype=str)),
                "dtype": (gdim, np.array([str(g["dtype"]) for g in groups], dtype=str)),
                "hardware": (gdim, np.array([str(g["hardware"]) for g in groups], dtype=str)),
                "statistic": ("statistic", np.array(statistics, dtype=str)),
            },
            attrs={
                "tolstat_table": TABLE_SCHEMA,
                "tolstat_version": str(meta.get("tolstat_version", __version__)),
                "fp_budget": float(_uf(meta["fp_budget"])),
                "confidence": float(_uf(meta["confidence"])),
                "form": str(meta.get("form") or ""),
                "statistics": ",".join(statistics),
                "budget_split": str(meta.get("budget_split", "bonferroni")),
                "provenance": json.dumps(meta.get("provenance", {}), sort_keys=True),
            },
        )
        keys = list(zip(ds["op"].values.tolist(), ds["dtype"].values.tolist(), ds["hardware"].values.tolist()))
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate (op, dtype, hardware) groups in a tolerance table")
        return cls(ds)

    def _group_dicts(self) -> list[dict[str, Any]]:
        d = self.data
        stats = [str(s) for s in d["statistic"].values]
        out = []
        for i in range(d.sizes["group"]):
            st = {}
            for j, s in enumerate(stats):
                top = d["top_scores"].values[i, j]
                st[s] = {
                    "threshold": _f(d["threshold"].values[i, j]),
                    "estimate": _f(d["estimate"].values[i, j]),
                    "budget": _f(d["budget"].values[i, j]),
                    "confidence": _f(d["stat_confidence"].values[i, j]),
                    "method": str(d["method"].values[i, j]),
                    "reason": str(d["reason"].values[i, j]),
                    "tail": {k: _f(d[f"tail_{k}"].values[i, j]) for k in ("u", "sigma", "xi", "zeta", "gof_p")},
                    "top_scores": [_f(v) for v in top[~np.isnan(top)]],
                }
            sj = str(d["scale_json"].values[i])
            out.append({
                "op": str(d["op"].values[i]),
                "dtype": str(d["dtype"].values[i]),
                "hardware": str(d["hardware"].values[i]),
                "n": int(d["n"].values[i]),
                "n_inexact": int(d["n_inexact"].values[i]),
                "scale": json.loads(sj) if sj else None,
                "statistics": st,
            })
        return out

    @property
    def meta(self) -> dict[str, Any]:
        """Table-level settings (budget, confidence, form, statistics, provenance)."""
        a = self.data.attrs
        return {
            "tolstat_table": TABLE_SCHEMA,
            "tolstat_version": str(a.get("tolstat_version", "")),
            "fp_budget": _f(a["fp_budget"]),
            "confidence": _f(a["confidence"]),
            "form": str(a.get("form", "")) or None,
            "statistics": [x for x in str(a["statistics"]).split(",") if x],
            "budget_split": str(a.get("budget_split", "")),
            "provenance": json.loads(str(a.get("provenance", "{}"))),
        }

    @property
    def fp_budget(self) -> float:
        """False-positive budget of one check."""
        return float(self.data.attrs["fp_budget"])

    @property
    def confidence(self) -> float:
        """Confidence of the promise."""
        return float(self.data.attrs["confidence"])

    @property
    def statistics(self) -> list[str]:
        """Statistic names, max-error statistic first."""
        return [str(s) for s in self.data["statistic"].values]

    @property
    def groups(self) -> list[tuple[str, str, str]]:
        """The (op, dtype, hardware) groups of the table."""
        d = self.data
        return list(zip(map(str, d["op"].values), map(str, d["dtype"].values), map(str, d["hardware"].values)))

    def __len__(self) -> int:
        return self.data.sizes["group"]

    def __repr__(self) -> str:
        lines = [f"<ToleranceTable: {len(self)} groups, fp_budget={self.fp_budget:g}, "
                 f"confidence={self.confidence:g}, form={self.meta['form']}, statistics={self.statistics}>"]
        for i, (op, dt, hw) in enumerate(self.groups[:20]):
            thr = ", ".join(f"{s}={self.data['threshold'].values[i, j]:.4g} ({self.data['method'].values[i, j]})"
                            for j, s in enumerate(self.statistics))
            lines.append(f"  {op} / {dt} / {hw}: n={int(self.data['n'].values[i])}: {thr}")
        if len(self) > 20:
            lines.append(f"  ... {len(self) - 20} more")
        return "\n".join(lines)

    # ---- lookup
    def _find(self, op: str, dtype: str, hardware: str | None) -> tuple[int, str] | None:
        keys = self.groups
        idx = {k: i for i, k in enumerate(keys)}
        for o, tag in ((op, ""), (ANY, "default op, ")):
            if hardware is not None and (o, dtype, hardware) in idx:
                return idx[(o, dtype, hardware)], tag + "exact"
            if (o, dtype, ANY) in idx:
                return idx[(o, dtype, ANY)], tag + "any hardware"
            if hardware is None:
                hws = [k for k in keys if k[0] == o and k[1] == dtype]
                if len(hws) == 1:
                    return idx[hws[0]], tag + "only hardware"
                if len(hws) > 1:
                    raise KeyError(
                        f"(op={op!r}, dtype={dtype!r}) is calibrated on several hardware "
                        f"{sorted(k[2] for k in hws)}; pass hardware=... (or calibrate with "
                        "by=('op', 'dtype') for a '*' entry)"
                    )
        return None

    def entry(self, op: str, dtype: Any, hardware: str | None = None, *,
              hardware_policy: str | None = None) -> ToleranceEntry:
        """The thresholds for (op, dtype, hardware), with the declared fallbacks.

        Parameters
        ----------
        op, dtype : str
            The group (any dtype spelling).
        hardware : str, optional
            Hardware label. With a ``hardware_policy`` and no ``hardware``, this
            machine's label (:func:`tolstat.hardware_fingerprint`).
        hardware_policy : {None, "exact", "pooled", "nearest", "error"}
            What to do when ``hardware`` is not calibrated (:mod:`tolstat.hwpolicy`);
            ``None`` keeps the fallbacks of the class docstring.

        Raises
        ------
        KeyError
            No group matches; the message lists the groups available (with a policy:
            this machine's hardware and the table's).
        """
        from ._dtypes import canonical_dtype

        dt = canonical_dtype(dtype)
        if hardware_policy is not None:  # explicit hardware policy (tolstat.hwpolicy)
            from . import hwpolicy

            hw = str(hardware) if hardware is not None else hwpolicy.machine_hardware()
            mx = self.data["threshold"].values[:, 0]
            hit = hwpolicy.resolve_group(self.groups, mx, str(op), dt, hw, hardware_policy)
            hardware = hw
        else:
            hit = self._find(str(op), dt, None if hardware is None else str(hardware))
        if hit is None:
            avail = ", ".join(f"({o}, {d}, {h})" for o, d, h in self.groups)
            raise KeyError(
                f"no tolerance for op={op!r}, dtype={dt!r}, hardware={hardware!r} (fallbacks tried: exact "
                f"hardware, hardware '*', op '*'); available groups: {avail}"
            )
        i, how = hit
        d = self.data
        stats: dict[str, StatEntry] = {}
        for j, s in enumerate(self.statistics):
            thr = float(d["threshold"].values[i, j])
            if math.isnan(thr):
                raise KeyError(f"group ({op}, {dt}, {d['hardware'].values[i]}) has no {s} threshold: "
                               f"{d['reason'].values[i, j]}")
            top = d["top_scores"].values[i, j]
            stats[s] = StatEntry(
                statistic=s, threshold=thr, estimate=float(d["estimate"].values[i, j]),
                budget=float(d["budget"].values[i, j]), confidence=float(d["stat_confidence"].values[i, j]),
                method=str(d["method"].values[i, j]), reason=str(d["reason"].values[i, j]),
                n=int(d["n"].values[i]),
                tail={k: float(d[f"tail_{k}"].values[i, j]) for k in ("u", "sigma", "xi", "zeta", "gof_p")},
                top=top[~np.isnan(top)],
            )
        sj = str(d["scale_json"].values[i])
        return ToleranceEntry(
            op=str(d["op"].values[i]), dtype=dt, hardware=str(d["hardware"].values[i]),
            requested_hardware=hardware, fallback=how, n=int(d["n"].values[i]), statistics=stats,
            scale=ScaleModel.from_dict(json.loads(sj)) if sj else None,
            fp_budget=self.fp_budget, confidence=self.confidence,
        )

    lookup = entry

    # ---- export
    def to_dict(self) -> dict[str, Any]:
        """The JSON layout: ``{"tolstat_table": 1, ..., "groups": [...]}``."""
        out = self.meta
        out["groups"] = self._group_dicts()
        return out

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write (and return) the table as stable, human-readable, versioned JSON.

        Floats are written with ``repr`` (shortest exact round trip); ``inf``/``nan``
        as the strings ``"inf"``/``"nan"``. The layout is made for review
        (:mod:`tolstat.review`): fixed key order, groups sorted, thresholds also in
        user units, one line per list of calibration scores, and the volatile
        provenance (``created``, ``host``, ``pid``) in its own block at the end.
        """
        from .review import table_json

        text = table_json(self)
        if path is not None:
            import uuid

            p = Path(path)
            tmp = p.with_name(f".{p.name}.tmp-{uuid.uuid4().hex[:8]}")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, p)
        return text

    def to_netcdf(self, path: str | os.PathLike[str]) -> Path:
        """Write the table's dataset to netCDF-4 (h5netcdf)."""
        p = Path(path)
        self.data.to_netcdf(p, engine="h5netcdf")
        return p

    save = to_json

    def to_assert_close_kwargs(
        self,
        hardware: str | None = None,
        covariates: Mapping[str, Any] | None = None,
        *,
        skip_unsupported: bool = True,
        hardware_policy: str | None = None,
    ) -> dict[tuple[str, str], dict[str, float]]:
        """``{(op, dtype): {"atol": ..., "rtol": ...}}`` for ``torch.testing.assert_close``.

        This is the form of PyTorch's ``toleranceOverride({dtype: tol(atol, rtol)})``.
        Only the max-error statistic is translated (a bias statistic has no allclose
        form; use :func:`tolstat.check` for it).

        Parameters
        ----------
        hardware : str, optional
            Which hardware's groups (with the usual fallbacks).
        covariates : mapping, optional
            Run covariates of a size-aware / normalised scale (e.g. ``{"K": 512}``;
            ``ref_rms`` for a linear ``ref_rms`` term).
        skip_unsupported : bool, default True
            Leave out groups without an allclose form (``max_ulp``, baseline-relative,
            missing covariates) instead of raising.
        hardware_policy : {None, "exact", "pooled", "nearest", "error"}
            Passed to :meth:`entry` (:mod:`tolstat.hwpolicy`).
        """
        out: dict[tuple[str, str], dict[str, float]] = {}
        for op, dt in dict.fromkeys((o, d) for o, d, _ in self.groups):
            try:
                atol, rtol = self.entry(op, dt, hardware, hardware_policy=hardware_policy).allclose(covariates)
            except (ValueError, KeyError):
                if skip_unsupported:
                    continue
                raise
            out[(op, dt)] = {"atol": atol, "rtol": rtol}
        return out


def load_table(path: str | os.PathLike[str]) -> ToleranceTable:
    """Read a table written by :meth:`ToleranceTable.to_json` or :meth:`~ToleranceTable.to_netcdf`.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not a tolstat table, or an unsupported schema version.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no tolerance table at {os.fspath(p)!r}")
    if p.suffix.lower() == ".json":
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(p)!r} is not valid JSON: {exc}") from exc
        if not isinstance(d, dict) or "tolstat_table" not in d:
            raise ValueError(f"{os.fspath(p)!r} is not a tolstat tolerance table")
        if int(d["tolstat_table"]) != TABLE_SCHEMA:
            raise ValueError(f"{os.fspath(p)!r}: table schema {d['tolstat_table']} is not supported "
                             f"(this tolstat reads {TABLE_SCHEMA})")
        if isinstance(d.get("volatile"), dict):  # reviewable layout (tolstat.review): keep it
            d["provenance"] = {**d.get("provenance", {}), "volatile": d["volatile"]}
        return ToleranceTable.from_groups(d["groups"], d)
    ds = xr.open_dataset(p, engine="h5netcdf").load()
    ds.close()
    for v in ("op", "dtype", "hardware", "statistic", "method", "reason", "scale_json"):
        if v in ds.variables and ds[v].dtype.kind == "O":
            ds[v] = ds[v].astype(str)
    return ToleranceTable(ds)


# --------------------------------------------------------------------------- select
def _group_keys(ds: xr.Dataset, by: Sequence[str]) -> tuple[list[tuple[str, str, str]], np.ndarray]:
    cols = []
    for name in ("op", "dtype", "hardware"):
        cols.append(np.asarray(ds[name].values).astype(str) if name in by
                    else np.full(ds.sizes["run"], ANY))
    keys = np.array(["\x00".join(t) for t in zip(*cols)])
    uniq, inv = np.unique(keys, return_inverse=True)
    return [tuple(u.split("\x00")) for u in uniq], inv  # type: ignore[misc]


def select(
    errors_or_fit: xr.Dataset,
    *,
    fp_budget: float,
    confidence: float = 0.95,
    method: str = "auto",
    statistic: str | Sequence[str] = "max_abs",
    form: str | None = None,
    by: Sequence[str] = ("op", "dtype", "hardware"),
    budget_split: str = "bonferroni",
    scale_quantile: float = 0.99,
    size_covariate: str | None = None,
    linear_covariates: Sequence[str] = ("ref_rms",),
    power_covariates: Sequence[str] = (),
    baseline: str = "baseline_max_abs",
    baseline_floor: float = 1.0,
    solver: str = "statsmodels",
    n_resamples: int = 1000,
    seed: int = 0,
    min_tail_runs: int = 50,
    max_extrapolation: float = 1000.0,
    tail_fraction: float = 0.1,
    min_exceedances: int = 30,
    tail_bound: str = "conservative",
    on_error: str = "raise",
) -> ToleranceTable:
    """Thresholds per (op, dtype, hardware) that keep a false-positive budget.

    Parameters
    ----------
    errors_or_fit : xarray.Dataset
        An error dataset of *correct* runs (``docs/schema.md``).
    fp_budget : float
        Largest acceptable probability that a check of a correct run fails, in (0, 1).
        For a suite of N checks use :func:`split_budget`.
    confidence : float, default 0.95
        Confidence that the promise holds (the thresholds are upper confidence bounds).
    method : {"auto", "order_statistic", "conformal", "evt"}
        See :func:`calibrate`; ``auto`` records per group which method and why.
    statistic : str or sequence of str, default "max_abs"
        The max-error statistic (``"max_abs"``, ``"max_ulp"`` or ``"max_rel"``),
        optionally with ``"bias"`` (e.g. ``("max_abs", "bias")``): the budget and
        confidence are then split between the statistics (``budget_split``).
    form : {None, "allclose", "size_aware", "normalised", "baseline"}
        Noise-scale model (:mod:`tolstat.scale`). With a form the max-error statistic
        is the normalised score ``max_i |d_i| / s(|ref_i|, covariates)`` (table name
        ``"max_score"``) and needs ``statistic="max_abs"``.
    by : sequence of str, default ("op", "dtype", "hardware")
        Grouping; leave out ``"hardware"`` to calibrate one ``"*"`` entry over all
        hardware (``op`` and ``dtype`` are required).
    budget_split : {"bonferroni", "sidak"}
        How the budget is split between statistics (:func:`split_budget`).
    scale_quantile : float, default 0.99
        Element-error quantile the scale model is fitted at (only its shape matters).
    size_covariate : str, optional
        ``size_aware``: the size covariate (default ``"K"``, else ``"n_elements"``).
    linear_covariates, power_covariates : sequence of str
        ``normalised``: additive and power-law run covariates.
    baseline, baseline_floor :
        ``baseline``: covariate holding the same-precision baseline's max error, and
        the floor ``baseline_floor * eps * ref_rms`` used when the baseline error is 0.
    solver : {"statsmodels", "lp"}
        Quantile regression solver of the scale fit.
    n_resamples, seed, min_tail_runs, max_extrapolation, tail_fraction, min_exceedances, tail_bound :
        Tail model settings (:func:`calibrate`).
    on_error : {"raise", "skip"}
        ``"skip"`` keeps groups that cannot be calibrated in the table with a NaN
        threshold and the reason (looking them up raises).

    Returns
    -------
    ToleranceTable

    Raises
    ------
    ValueError
        Bad budget/confidence/statistic/form; a group that cannot be calibrated (the
        message names the group and the runs needed); NaN or infinite calibration data.

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
    """
    a = _unit("fp_budget", fp_budget)
    g = _unit("confidence", confidence)
    if method not in SELECT_METHODS:
        raise ValueError(f"method must be one of {SELECT_METHODS}, got {method!r}")
    stats_req = [statistic] if isinstance(statistic, str) else list(statistic)
    max_stats = [s for s in stats_req if s != "bias"]
    if len(max_stats) != 1 or any(s not in ("max_abs", "max_ulp", "max_rel", "bias") for s in stats_req) \
            or len(set(stats_req)) != len(stats_req):
        raise ValueError(f"statistic must be one of 'max_abs', 'max_ulp', 'max_rel', optionally with 'bias', "
                         f"got {statistic!r}")
    if form is not None and form not in FORMS:
        raise ValueError(f"form must be None or one of {FORMS}, got {form!r}")
    if form is not None and max_stats[0] != "max_abs":
        raise ValueError(f"form={form!r} normalises the absolute error: use statistic='max_abs' "
                         f"(got {max_stats[0]!r})")
    if on_error not in ("raise", "skip"):
        raise ValueError("on_error must be 'raise' or 'skip'")
    by = tuple(by)
    if "op" not in by or "dtype" not in by or not set(by) <= {"op", "dtype", "hardware"}:
        raise ValueError(f"by must contain 'op' and 'dtype' (and optionally 'hardware'), got {by!r}")
    if not isinstance(errors_or_fit, xr.Dataset):
        raise TypeError(f"select needs an error dataset (xarray.Dataset), got {type(errors_or_fit).__name__}")
    if "run" not in errors_or_fit.dims:
        raise ValueError("select needs an error dataset with a 'run' dimension (see docs/schema.md); "
                         "results of tolstat.estimators.fit carry no budget and cannot be re-calibrated")
    ds = validate(errors_or_fit)
    max_name = "max_score" if form is not None else max_stats[0]
    names = [max_name] + (["bias"] if "bias" in stats_req else [])
    m = len(names)
    a_each = split_budget(a, m, method=budget_split) if m > 1 else a
    g_each = 1.0 - (1.0 - g) / m
    keys, inv = _group_keys(ds, by)
    groups = []
    for gi, key in enumerate(keys):
        sub = ds.isel(run=np.flatnonzero(inv == gi))
        label = "(" + ", ".join(key) + ")"
        entry: dict[str, Any] = {"op": key[0], "dtype": key[1], "hardware": key[2], "n": int(sub.sizes["run"]),
                                 "n_inexact": 0, "scale": None, "statistics": {}}
        try:
            model = None
            if form is not None:
                model = fit_scale(sub, form, quantile=scale_quantile, size_covariate=size_covariate,
                                  linear=linear_covariates if form == "normalised" else (),
                                  power=power_covariates if form == "normalised" else (),
                                  baseline=baseline, floor=baseline_floor, solver=solver, seed=seed)
                entry["scale"] = model.to_dict()
            for name in names:
                if name == "bias":
                    x = bias_scores(sub)
                    n_inexact = 0
                else:
                    x, n_inexact = run_scores(sub, model, max_stats[0])
                    entry["n_inexact"] = n_inexact
                cal = calibrate(x, a_each, g_each, method, n_resamples=n_resamples, seed=seed,
                                min_tail_runs=min_tail_runs, max_extrapolation=max_extrapolation,
                                tail_fraction=tail_fraction, min_exceedances=min_exceedances,
                                tail_bound=tail_bound, label=label + f" statistic {name}")
                reason = cal.reason
                if m > 1:
                    reason += (f"; budget {a:g} split over {m} statistics ({budget_split}): {a_each:.6g} "
                               f"each at confidence {g_each:.6g}")
                if n_inexact:
                    reason += (f"; {n_inexact} run(s) had a truncated Pareto front: their scores are lower "
                               "bounds")
                entry["statistics"][name] = {
                    "threshold": cal.threshold, "estimate": cal.estimate, "budget": cal.budget,
                    "confidence": cal.confidence, "method": cal.method, "reason": reason,
                    "tail": cal.tail, "top_scores": cal.top.tolist(),
                }
        except ValueError as exc:
            if on_error == "raise":
                raise
            for name in names:
                entry["statistics"].setdefault(name, {
                    "threshold": math.nan, "estimate": math.nan, "budget": a_each, "confidence": g_each,
                    "method": "refused", "reason": str(exc), "tail": {}, "top_scores": [],
                })
        groups.append(entry)
    prov = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tolstat_version": __version__,
        "function": "tolstat.select",
        "settings": {"fp_budget": a, "confidence": g, "method": method, "statistic": stats_req, "form": form,
                     "by": list(by), "budget_split": budget_split, "scale_quantile": scale_quantile,
                     "n_resamples": n_resamples, "seed": seed, "min_tail_runs": min_tail_runs,
                     "max_extrapolation": max_extrapolation, "tail_fraction": tail_fraction,
                     "min_exceedances": min_exceedances, "solver": solver,
                     "tail_bound": tail_bound},
        "errors_provenance": json.loads(ds.attrs.get("provenance", "[]")),
        "n_runs": int(ds.sizes["run"]),
    }
    meta = {"fp_budget": a, "confidence": g, "form": form, "statistics": names, "budget_split": budget_split,
            "provenance": prov}
    return ToleranceTable.from_groups(groups, meta)
