"""Certificates of the certified engine: what each group's threshold promises.

:class:`GroupCertificate` (one group's threshold on the combined score, its promise stated
exactly, and the numbers behind it), the text of the order-statistic promise, and the
state of one :func:`tolstat.calibration.engine.certify` call (``_Ctx``) whose ``_finish``
applies the resolution floor, flags statistics that cannot reach the threshold
(:class:`UnreachableThresholdWarning`) and records the certificate.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tolstat._base.util import NotEnoughData
from tolstat.measure.noise import combined_score
from tolstat.models.estimators.orderstat import (
    conformal_min_n,
    conformal_rank,
    order_statistic_min_n,
    order_statistic_rank,
)

__all__ = [
    "TOP_SCORES",
    "UnreachableThresholdWarning",
    "GroupCertificate",
]

#: calibration scores kept per group (largest first) for re-budgeting
TOP_SCORES = 256


class UnreachableThresholdWarning(UserWarning):
    """A threshold at or above the largest value a statistic can take (it can never fail)."""


@dataclass(frozen=True)
class GroupCertificate:
    """Threshold of one group on the combined score, and exactly what it promises.

    Attributes
    ----------
    group : str
    threshold : float
        A run fails when ``combined_score(stats, normalisers) > threshold``.
    method : str
        ``"order_statistic"`` (PAC, own units), ``"pooled_order_statistic"`` (PAC if the
        group is exchangeable with its pool), ``"exact"`` (all units exactly zero: the
        resolution floor, no probabilistic promise) or ``"conformal"`` (marginal).
    guarantee : str
        The promise, stated exactly with its assumptions.
    fp_budget, confidence : float
    normalisers : dict str -> float
        ``q_j`` of the statistics in the score.
    floor : float
        Resolution floor on ``S`` (``max_j floor_j / q_j``); the threshold is at least this.
    n_runs, n_units, n_duplicates : int
        Runs given, independent units after collapsing, duplicate runs dropped.
    n_clusters : int or None
    n_fit, n_cal : int
        Units of the fitting part A and the calibration part B.
    rank, n_scores : int
        The threshold is the ``rank``-th smallest of ``n_scores`` scores (0 for ``exact``).
    pool : tuple of str
        Groups whose scores were pooled (empty when the group's own units sufficed).
    pool_p : float
        Holm-adjusted p-value of the group's exchangeability test (NaN if not tested).
    reason : str
        Why this method, with the numbers.
    flags : tuple of str
        ``"floor_raised"`` (the floor lifted the threshold), ``"unreachable:<stat>"`` (the
        statistic cannot reach the threshold), ``"never_fails"`` (no statistic can),
        ``"weakly_tested"`` (a pooled group tested on fewer than ``min_test_units`` scores).
    unreachable : tuple of str
        Statistics whose known maximum is at or below their share of the threshold.
    """

    group: str
    threshold: float
    method: str
    guarantee: str
    fp_budget: float
    confidence: float
    normalisers: dict[str, float]
    floor: float
    n_runs: int
    n_units: int
    n_duplicates: int
    n_clusters: int | None
    n_fit: int
    n_cal: int
    rank: int
    n_scores: int
    pool: tuple[str, ...] = ()
    pool_p: float = math.nan
    reason: str = ""
    flags: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    #: the largest calibration scores (at most :data:`TOP_SCORES`, descending) of an
    #: ``order_statistic`` group: what a smaller budget's threshold needs (re-budgeting)
    top_scores: tuple[float, ...] = ()

    def score(self, stats: Mapping[str, Any], *, which: bool = False) -> Any:
        """:func:`~tolstat.measure.noise.combined_score` with this group's normalisers."""
        return combined_score(stats, self.normalisers, which=which)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict of every field (tuples as lists)."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def passes(self, stats: Mapping[str, Any]) -> np.ndarray:
        """True where a run's combined score is within the threshold (NaN score passes)."""
        s = self.score(stats)
        return ~(s > self.threshold)


def _guarantee_pac(a: float, g: float, n: int, r: int, *, clusters: bool) -> str:
    unit = "cluster (declared clusters are one unit each)" if clusters else "run"
    return (f"PAC: with probability >= {g:g} over the calibration units, the probability that the "
            f"check of a new correct {unit} fails is <= {a:g}. Assumes the units are independent and "
            f"identically distributed and a new run comes from the same distribution; the threshold is "
            f"the {r}-th smallest of {n} scores, valid at finite n because the normalisers were fitted on "
            "other units (or cannot change the ranks).")


def _max_bound(n: int, g: float) -> float:
    """The budget that the largest of ``n`` independent scores certifies at confidence ``g``:
    ``1 - (1 - g)^(1/n)`` (``P(all n below the (1 - a)-quantile) = (1 - a)^n``)."""
    return float(-math.expm1(math.log1p(-g) / n))


@dataclass
class _Ctx:
    """Shared state of one :func:`~tolstat.calibration.engine.certify` call."""

    a: float
    g: float
    rule: str
    names: tuple[str, ...]
    floors: np.ndarray
    uppers: np.ndarray
    clusters_declared: bool
    seed: int
    norm_quantile: float
    own_pool: bool = False
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    certs: dict[str, GroupCertificate] = field(default_factory=dict)
    refused: dict[str, NotEnoughData] = field(default_factory=dict)
    _ranks: dict[int, int] = field(default_factory=dict)

    @property
    def nmin(self) -> int:
        p = 1.0 - self.a
        return order_statistic_min_n(p, self.g) if self.rule == "order_statistic" else conformal_min_n(self.a)

    def rank_of(self, k: int) -> int:
        if k not in self._ranks:
            self._ranks[k] = (int(order_statistic_rank(k, 1.0 - self.a, self.g)[0]) if self.rule == "order_statistic"
                              else int(conformal_rank(k, self.a)[0]))
        return self._ranks[k]

    def need(self, d: dict[str, Any]) -> int:
        """Units the group alone would need: B's minimum plus the smallest fitting part (1)."""
        return self.nmin + (0 if d["v"].shape[1] <= 1 else 1)

    def refuse(self, gname: str, msg: str, need: int) -> None:
        self.refused[gname] = NotEnoughData(f"group {gname}: {msg}", n_needed=int(need), group=gname)


def _finish(ctx: _Ctx, gname: str, raw: float, method: str, guarantee: str, q: np.ndarray, an: tuple[str, ...],
            rank: int, n_scores: int, reason: str, pool: tuple[str, ...] = (), pool_p: float = math.nan,
            split: tuple[int, int] | None = None, extra_flags: tuple[str, ...] = (),
            top: tuple[float, ...] = ()) -> None:
    """Apply the floor, flag unreachable statistics and record the group's certificate."""
    d = ctx.info[gname]
    n_fit, n_cal = split if split is not None else (int(d["iA"].size), int(d["iB"].size))
    act = d["active"]
    s_floor = float(np.max(ctx.floors[act] / q))
    thr = max(raw, s_floor)
    flags = list(extra_flags)
    if thr > raw:
        flags.append("floor_raised")
        reason += f"; raised from {raw:.6g} to the resolution floor {s_floor:.6g}"
    up = ctx.uppers[act] / q
    unreach = tuple(nm for nm, uq in zip(an, up) if thr >= uq)
    flags += [f"unreachable:{nm}" for nm in unreach]
    if unreach:
        never = len(unreach) == len(an)
        if never:
            flags.append("never_fails")
        msg = (f"group {gname}: threshold {thr:.6g} on the combined score is at or above the largest value "
               f"that {', '.join(unreach)} can reach ({', '.join(f'{nm}: {uq:.6g}' for nm, uq in zip(an, up) if thr >= uq)}"
               f" after normalisation): {'the check can never fail' if never else 'those statistics can never fail the check'}")
        warnings.warn(msg, UnreachableThresholdWarning, stacklevel=4)
        reason += "; " + msg
    u = d["units"]
    ctx.certs[gname] = GroupCertificate(
        group=gname, threshold=float(thr), method=method, guarantee=guarantee, fp_budget=ctx.a, confidence=ctx.g,
        normalisers={str(nm): float(x) for nm, x in zip(an, q)}, floor=s_floor, n_runs=u.n_runs, n_units=u.n,
        n_duplicates=u.n_duplicates, n_clusters=u.n_clusters, n_fit=n_fit,
        n_cal=n_cal, rank=int(rank), n_scores=int(n_scores), pool=pool, pool_p=pool_p,
        reason=reason, flags=tuple(flags), unreachable=unreach, top_scores=top)
