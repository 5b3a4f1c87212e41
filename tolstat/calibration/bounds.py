"""Bounds of the ``1 - budget`` quantile of a check statistic over correct runs.

Step between the estimators and the selection (estimators -> **bounds** -> selection ->
table -> checks): the pieces :func:`tolstat.calibration.calibrate` assembles, each with the
promise it keeps and the data it needs (``docs/selection.md``):

* :func:`order_statistic_threshold`: the distribution-free order statistic (needs
  ``n >= ln(1 - confidence) / ln(1 - budget)`` runs);
* :func:`conformal_threshold`: the split-conformal quantile (a marginal guarantee);
* :func:`tail_fit` and :func:`tail_threshold`: a GPD peaks-over-threshold tail model
  with an upper confidence bound of the return level, and its adequacy rules
  (:class:`TailOptions`);
* :func:`exceedance_probability`: how likely a correct run reaches a value;

When no bound can be given, :class:`~tolstat._base.util.NotEnoughData` says how many runs are needed.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from scipy import stats as _st

from tolstat._base.util import NotEnoughData
from tolstat._base.validate import unit_interval as _unit
from tolstat.models.estimators import evt as _evt
from tolstat.models.estimators.bootstrap import bootstrap_return_level_bound
from tolstat.models.estimators.orderstat import conformal_bound, conformal_min_n, order_statistic_bound, order_statistic_min_n

__all__ = [
    "TailOptions",
    "Calibration",
    "TailFit",
    "order_statistic_threshold",
    "conformal_threshold",
    "tail_fit",
    "tail_threshold",
    "exceedance_probability",
    "Exceedance",
]

TAIL_BOUNDS = ("conservative", "bootstrap")


@dataclass(frozen=True)
class TailOptions:
    """Settings of the extreme-value tail model (the bound used when runs are few).

    Attributes
    ----------
    n_resamples : int, default 1000
        Parametric-bootstrap resamples (``bound="bootstrap"``).
    min_tail_runs : int, default 50
        Fewest runs a tail model is fitted on.
    max_extrapolation : float, default 1000
        Largest ``1/(budget*n)``: how far beyond the data the tail may extrapolate.
    tail_fraction : float, default 0.1
        Fraction of the runs in the tail (threshold rule of the GPD fit).
    min_exceedances : int, default 30
        Fewest exceedances of the tail threshold (at least 2).
    bound : {"conservative", "bootstrap"}, default "conservative"
        Upper bound of the GPD return level (see :func:`tail_threshold`).
    """

    n_resamples: int = 1000
    min_tail_runs: int = 50
    max_extrapolation: float = 1000.0
    tail_fraction: float = 0.1
    min_exceedances: int = 30
    bound: str = "conservative"

    def __post_init__(self) -> None:
        if self.bound not in TAIL_BOUNDS:
            raise ValueError(f"TailOptions.bound must be 'conservative' or 'bootstrap', got {self.bound!r}")
        for name in ("n_resamples", "min_tail_runs", "min_exceedances"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"TailOptions.{name} must be a positive integer, got {v!r}")
        if self.min_exceedances < 2:
            raise ValueError(f"TailOptions.min_exceedances must be >= 2 (a tail fit needs two exceedances), "
                             f"got {self.min_exceedances!r}")
        if not self.max_extrapolation >= 1:
            raise ValueError(f"TailOptions.max_extrapolation must be >= 1, got {self.max_extrapolation!r}")
        _unit("TailOptions.tail_fraction", self.tail_fraction)

    def to_dict(self) -> dict[str, Any]:
        """Provenance form: the field names and values (``TailOptions(**d)`` rebuilds it)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TailFit:
    """GPD tail fit of calibration scores and whether it is adequate.

    Attributes
    ----------
    tail : dict
        ``u, sigma, xi, zeta, gof_p`` (NaN when not fitted).
    why_not : str
        Why the tail model is inadequate (empty when adequate).
    """

    tail: dict[str, float]
    why_not: str


@dataclass(frozen=True)
class Exceedance:
    """Estimated probability that a correct run's statistic reaches a value.

    Attributes
    ----------
    probability : float
    note : str
        How it was estimated.
    """

    probability: float
    note: str


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class Calibration:
    """A threshold for one statistic of one group and how it was obtained.

    The one threshold record: :func:`tolstat.calibration.calibrate` returns it, and a
    :class:`~tolstat.calibration.table.ToleranceEntry` holds one per statistic (with
    ``statistic`` set).

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
    statistic : str
        The statistic's name in a table entry (``""`` from :func:`calibrate`).
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
    statistic: str = ""


_NAN_TAIL = {"u": math.nan, "sigma": math.nan, "xi": math.nan, "zeta": math.nan, "gof_p": math.nan}


def tail_fit(x: np.ndarray, tail_fraction: float, min_exc: int) -> TailFit:
    """GPD fit of the top of ``x``, a KS goodness-of-fit p-value and the adequacy verdict."""
    if x.size < min_exc + 1:
        return TailFit(dict(_NAN_TAIL), f"n = {x.size} < {min_exc + 1} runs needed for a tail fit")
    fit = _evt.pot_fit(x, 0.5 / x.size, tail_fraction=tail_fraction, min_exceedances=min_exc)
    xs = np.sort(x)
    y = xs[xs > fit["u"]] - fit["u"]
    tail = {"u": fit["u"], "sigma": fit["sigma"], "xi": fit["xi"], "zeta": fit["zeta"], "gof_p": math.nan}
    nd = np.unique(y).size
    if nd < 10:
        return TailFit(tail, (f"only {nd} distinct values above the tail threshold (lattice or ties): "
                              "a continuous GPD tail does not describe them"))
    if not fit["sigma"] > 0:
        return TailFit(tail, "degenerate tail (zero scale)")
    p = float(_st.kstest(y, _st.genpareto(fit["xi"], 0.0, fit["sigma"]).cdf).pvalue)
    tail["gof_p"] = p
    if p < 0.05:
        return TailFit(tail, f"GPD tail rejected by a KS test (p = {p:.3g} < 0.05)")
    if fit["xi"] >= 1:
        return TailFit(tail, f"tail too heavy (xi = {fit['xi']:.3g} >= 1: infinite mean)")
    return TailFit(tail, "")


def order_statistic_threshold(x: np.ndarray, a: float, g: float, tail: dict[str, float],
                              top: np.ndarray) -> Calibration:
    """The distribution-free bound: the order statistic of rank ``binom.ppf(g, n, 1 - a) + 1``.

    The caller checks ``n >= order_statistic_min_n(1 - a, g)``.
    """
    n = int(x.size)
    p = 1.0 - a
    nmin = order_statistic_min_n(p, g)
    bound, rank, _ = order_statistic_bound(x, p, g)
    reason = (f"order statistic: n = {n} >= {nmin} runs needed for the {p:.10g}-quantile at "
              f"{g:.10g} confidence; threshold = {int(rank[0])}-th smallest of {n} scores")
    if float(bound[0]) == 0.0:
        reason += " (all calibration scores at this rank are 0: any error fails)"
    est = float(np.quantile(x, p, method="higher"))
    return Calibration(float(bound[0]), est, a, g, "order_statistic", reason, n, tail, top)


def conformal_threshold(x: np.ndarray, a: float, g: float, tail: dict[str, float], top: np.ndarray,
                        where: str = "") -> Calibration:
    """The split-conformal quantile (marginal guarantee); :class:`NotEnoughData` below its n."""
    n = int(x.size)
    cmin = conformal_min_n(a)
    if n < cmin:
        raise NotEnoughData(f"{where}n = {n} runs are too few for a split-conformal bound at budget {a:g}: "
                            f"need n >= {cmin}", n=n, n_needed=cmin)
    bound, rank, _ = conformal_bound(x, a)
    reason = (f"split conformal: {int(rank[0])}-th smallest of {n} scores; marginal guarantee "
              "P(new score > threshold) <= budget averaged over calibration sets (no confidence level)")
    est = float(np.quantile(x, 1.0 - a, method="higher"))
    return Calibration(float(bound[0]), est, a, g, "conformal", reason, n, tail, top)


def tail_threshold(x: np.ndarray, a: float, g: float, fitted: TailFit, top: np.ndarray,
                   options: TailOptions, *, seed: int = 0, where: str = "") -> Calibration:
    """Upper confidence bound of the GPD return level at exceedance probability ``a``.

    Refused (:class:`NotEnoughData`) when the tail model is inadequate: fewer than
    ``options.min_tail_runs`` runs, more than ``options.max_extrapolation`` times beyond
    the data, or a tail fit that fails its checks (:func:`tail_fit`). The bound is
    ``options.bound``: ``"conservative"`` (return level at upper bounds of the shape
    and the scale, :func:`_conservative_tail_bound`) or ``"bootstrap"`` (percentile
    parametric bootstrap). Never below the sample maximum.
    """
    n = int(x.size)
    nmin = order_statistic_min_n(1.0 - a, g)
    tail = fitted.tail
    need = (f"the order statistic needs n >= {nmin} runs for budget {a:g} at confidence {g:g} "
            f"(n >= ln(1-confidence)/ln(1-budget)); have n = {n}")
    problems = []
    if n < options.min_tail_runs:
        problems.append(f"n = {n} < {options.min_tail_runs} runs required for a tail model")
    extrap = 1.0 / (a * n)
    if extrap > options.max_extrapolation:
        problems.append(f"budget {a:g} lies {extrap:.3g}x beyond the data (1/(budget*n)), more than "
                        f"max_extrapolation = {options.max_extrapolation:g}")
    if fitted.why_not:
        problems.append(fitted.why_not)
    if problems:
        raise NotEnoughData(
            f"{where}{need}; the tail model was refused: {'; '.join(problems)}. Collect at least "
            f"{nmin} runs, or raise fp_budget", n=n, n_needed=nmin)
    k = max(int(round(tail["zeta"] * n)), 1)
    est = float(_evt.gpd_return_level(tail["u"], tail["sigma"], tail["xi"], tail["zeta"], a)) \
        if a < tail["zeta"] else float(np.quantile(x, 1.0 - a, method="higher"))
    if options.bound == "bootstrap":
        r = bootstrap_return_level_bound(x, a, confidence=g, n_resamples=options.n_resamples,
                                         method="percentile", resampling="parametric", seed=seed,
                                         tail_fraction=options.tail_fraction,
                                         min_exceedances=options.min_exceedances)
        bound = float(r.bound)
        how = (f"{g:g} parametric-bootstrap percentile upper bound ({options.n_resamples} resamples; known to "
               "under-cover for small tails)")
    else:
        bound, how = _conservative_tail_bound(x, tail, a, g)
    thr = max(bound, float(x.max()))
    reason = (f"evt (model-based, no finite-sample guarantee): n = {n} < {nmin} runs for the order statistic; GPD tail over the top "
              f"{k} of {n} scores (xi = {tail['xi']:.3g}, KS p = {tail['gof_p']:.2g}); "
              f"threshold = {how} of the return level at exceedance probability {a:g} (point estimate "
              f"{est:.6g}), extrapolating {extrap:.3g}x beyond the data")
    return Calibration(thr, est, a, g, "evt", reason, n, tail, top)


def _conservative_tail_bound(x: np.ndarray, tail: Mapping[str, float], q: float,
                            g: float) -> tuple[float, str]:
    """Return level at upper confidence bounds of xi and sigma: ``(bound, how)``.

    The shape bound is ``max(xi_hat, 0) + z*(1 + max(xi_hat, 0))/sqrt(k)``, the scale
    bound ``sigma_hat * 2k / chi2_{1-g'}(2k)`` (exact for an exponential tail), each at
    ``g' = 1 - (1-g)/2``; the return level increases in both, so the bound holds with
    confidence >= g under the GPD model and never assumes a bounded tail.
    """
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


def exceedance_probability(value: float, cal: Any) -> Exceedance:
    """Estimated probability that a correct run's statistic is ``>= value``.

    From the empirical calibration distribution inside the data; from the GPD tail fit
    beyond the largest calibration score (with a note), or ``< 1/(n+1)`` with no tail.
    ``cal`` is a :class:`Calibration` (of :func:`calibrate` or a table entry: ``n``, ``top``, ``tail``).
    """
    n = int(cal.n)
    top = np.asarray(cal.top, dtype=np.float64)
    top = top[~np.isnan(top)]
    if not np.isfinite(value):
        return Exceedance(0.0, "non-finite output (NaN/Inf): never produced by the correct calibration runs")
    mx = float(top[0]) if top.size else math.nan
    if top.size and value <= mx:
        if value >= top[-1] or top.size == n:
            k = int(np.sum(top >= value))
            return Exceedance(k / n, f"empirical: {k} of {n} calibration runs reached this value")
        return Exceedance(top.size / n, f"empirical: more than {top.size} of {n} calibration runs reached this value")
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
            return Exceedance(0.0, (f"{beyond}; above the endpoint {u - s / xi:.4g} of the fitted bounded GPD tail "
                         f"(xi = {xi:.3g}): the model gives no correct run this large"))
        return Exceedance(pr, f"{beyond}; GPD tail extrapolation (model-based, xi = {xi:.3g})")
    return Exceedance(1.0 / (n + 1), f"{beyond}; no tail model: probability < 1/(n+1)")
