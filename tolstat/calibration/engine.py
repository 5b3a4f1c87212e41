"""Certified calibration: per-run statistics -> one combined score -> a threshold with a stated promise.

This layer works on plain arrays. Its input is, per group (e.g. an (op, dtype, hardware)
cell), a few per-run *check statistics* ``T_j`` (e.g. the maximum, RMS and bias of the
normalised error of one kernel output); its output is, per group, a set of normalisers
``q_j`` and one threshold on the combined score

.. math:: S = \\max_j T_j / q_j ,

with the promise of the path that produced it, stated exactly
(:attr:`~tolstat.calibration.certificate.GroupCertificate.guarantee`). One combined score
is calibrated with the full budget: no budget is split between statistics.

This module holds the entry :func:`certify`, its result :class:`CertifyResult` and the
thresholds of groups that stand alone; the units, split and score are in
:mod:`tolstat.calibration.units`, the pooling of small groups in
:mod:`tolstat.calibration.pooling`, the certificates and their promises in
:mod:`tolstat.calibration.certificate`.

Steps, per group:

1. **Units** (:func:`~tolstat.calibration.units.collapse`). Exact duplicate runs (identical
   statistic vectors and covariates) are collapsed to one run, and each declared cluster
   (e.g. ``case``: the same inputs through several correct variants) to ONE unit, its
   per-statistic maximum. The maximum is conservative for any member: a run of any variant
   has ``S`` at most its unit's ``S``. Independence is *assumed across* units (clusters),
   never within.
2. **Split** (:func:`~tolstat.calibration.units.split_units`,
   :func:`~tolstat.calibration.units.fit_size`). A deterministic seeded split of the
   units into a fitting part A (normalisers) and a calibration part B (threshold).
   Conditional on A, the scores of B are i.i.d., so the order-statistic promise holds at
   finite n. With one statistic no split is needed and no normaliser is fitted: ``q = 1``,
   ``S = T``, so the threshold is in the statistic's own units (the number a check
   compares, :mod:`tolstat.calibration.decision`), and no run is spent on A.
3. **Threshold** on ``S`` from B (:func:`certify`): the distribution-free order statistic
   (PAC) when B is large enough; else partial pooling with other groups whose scores are
   exchangeable with the group's (a test that can refuse, Holm-controlled); an exact op (all
   statistics zero) gets the resolution floor; otherwise :class:`NotEnoughData`. Every
   threshold is at least the resolution floor, and thresholds a statistic cannot reach are
   flagged and warned about.

The extreme-value (GPD) tail path is deliberately absent: it broke its promise on
mixtures with rare large-error runs. Conformal thresholds are offered on request and
labelled *marginal*.

References
----------
Wilks, "Determination of sample sizes for setting tolerance limits" (order statistics).
Lei, G'Sell, Rinaldo, Tibshirani & Wasserman, "Distribution-Free Predictive Inference for
Regression" (split fitting of the normalisation).
Dunn, Wasserman & Ramdas, "Distribution-Free Prediction Sets for Two-Layer Hierarchical
Models" (pooling groups).
Lee, Barber & Willett, "Distribution-free inference with hierarchical data" (repeated
measurements of one unit are not independent draws).
Holm, "A Simple Sequentially Rejective Multiple Test Procedure".
Scholz & Stephens, "K-Sample Anderson-Darling Tests".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tolstat._base import validate as _validate
from tolstat._base.util import NotEnoughData, factorize, rows_by_code
from tolstat._base.validate import unit_interval as _unit_interval
from tolstat.calibration.certificate import (TOP_SCORES, GroupCertificate, _Ctx, _finish, _guarantee_pac, _max_bound,
                                            _outlier_flags, _score_floor)
from tolstat.calibration.pooling import _pool
from tolstat.calibration.units import (
    _as_matrix,
    _covariate_columns,
    _per_stat,
    collapse,
    fit_normalisers,
    fit_size,
    split_units,
    statistic_layout,
    unit_scores,
)

__all__ = [
    "CertifyOptions",
    "CertifyResult",
    "RULES",
    "certify",
]

#: threshold rules :func:`certify` accepts
RULES = ("order_statistic", "conformal")


@dataclass(frozen=True)
class CertifyOptions:
    """Settings of the certified engine beyond the data and the budget.

    Attributes
    ----------
    rule : {"order_statistic", "conformal"}, default "order_statistic"
        ``order_statistic``: the PAC bound. ``conformal``: the split-conformal rank, a
        *marginal* promise (no confidence level); no pooling.
    pooling : bool, default True
        Let groups with too few units borrow the scores of exchangeable groups.
    pool_by : mapping group -> key, optional
        Groups pool only with groups of the same key (e.g. the dtype). Default: one pool.
    pool_alpha : float, default 0.01
        Family-wise level of the exchangeability tests (Holm over the groups of a pool): the
        largest probability of refusing some group of an exchangeable pool, in (0, 1). Low
        by default so that exchangeable groups are rarely refused; a clear difference (e.g.
        scores 3x larger with 30 units) still gives p-values far below it.
    min_pool : int, default 3
        Fewest groups (the borrower included) a pool must have.
    min_test_units : int, default 8
        Fewest calibration units a group needs for its exchangeability test. With
        ``pool_normalisers="own"`` a group with fewer positive scores (mostly correctly
        rounded) is still tested when the test could refuse it; its threshold is then at
        least its own largest calibration score and it is flagged ``"weakly_tested"``.
    pool_normalisers : {"shared", "own"}, default "shared"
        ``"shared"``: a pool's normalisers are fitted on the union of small fitting parts
        of its members, and pooled scores are comparable as far as the statistics are.
        ``"own"``: each member's scores use its own normalisers (fitted on its own fitting
        part A, the scores from its part B), so pooled scores are in units of each group's
        own spread; exchangeability is tested in those units. Use it when the statistics
        differ in scale between groups (e.g. different operators).
    seed : int, default 0
        Seed of the A/B split (deterministic).
    fit_fraction, min_fit, max_fit : float, int, int, default 0.2, 10, 200
        Size of the fitting part A: see :func:`~tolstat.calibration.units.fit_size`.
    norm_quantile : float, default 1.0
        Quantile of each statistic over A used as its normaliser; the default, the largest
        value of A, balances the statistics in their tails, where the threshold of a small
        budget lies. A bulk quantile (e.g. 0.9) under-weights nothing but lets a statistic
        that is zero on most runs (a bias of the error beyond correct rounding) get a tiny
        normaliser, and its rare large values then set a threshold at which no other
        statistic can ever fail the check.
    accept_outliers : bool, default False
        A group whose threshold is set by one calibration score more than
        :data:`~tolstat.calibration.certificate.OUTLIER_RATIO` times the next smaller one (or
        the resolution floor) is flagged ``outlier`` with an
        :class:`~tolstat.calibration.certificate.OutlierRunWarning`; ``True`` accepts such
        runs as correct (flag ``outlier_accepted``, no warning).

    Raises
    ------
    ValueError
        An unknown ``rule`` or ``pool_normalisers``, or ``pool_alpha`` outside (0, 1).

    Examples
    --------
    >>> CertifyOptions(pool_normalisers="own", seed=3).seed
    3
    >>> CertifyOptions(pool_alpha=2)
    Traceback (most recent call last):
    ...
    ValueError: CertifyOptions.pool_alpha must lie strictly between 0 and 1, got 2.0
    """

    rule: str = "order_statistic"
    pooling: bool = True
    pool_by: Mapping[Any, Any] | None = None
    pool_alpha: float = 0.01
    min_pool: int = 3
    min_test_units: int = 8
    pool_normalisers: str = "shared"
    seed: int = 0
    fit_fraction: float = 0.2
    min_fit: int = 10
    max_fit: int = 200
    norm_quantile: float = 1.0
    accept_outliers: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.accept_outliers, (bool, np.bool_)):
            raise TypeError(f"CertifyOptions.accept_outliers must be True or False, got {self.accept_outliers!r}")
        if self.rule not in RULES:
            raise ValueError(f"CertifyOptions.rule must be one of {RULES}, got {self.rule!r}")
        _unit_interval("CertifyOptions.pool_alpha", self.pool_alpha)
        if self.pool_normalisers not in ("shared", "own"):
            raise ValueError(f"CertifyOptions.pool_normalisers must be 'shared' or 'own', "
                             f"got {self.pool_normalisers!r}")
        if not isinstance(self.pooling, (bool, np.bool_)):
            raise TypeError(f"CertifyOptions.pooling must be True or False, got {self.pooling!r}")
        for name, lo in (("min_pool", 2), ("min_test_units", 1), ("min_fit", 1), ("max_fit", 1), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"CertifyOptions.{name} must be an integer >= {lo}, got {v!r}")
        if self.max_fit < self.min_fit:
            raise ValueError(f"CertifyOptions needs min_fit <= max_fit, got min_fit={self.min_fit}, "
                             f"max_fit={self.max_fit}")
        if not (isinstance(self.fit_fraction, (int, float, np.floating)) and 0.0 <= self.fit_fraction < 1.0):
            raise ValueError(f"CertifyOptions.fit_fraction must lie in [0, 1), got {self.fit_fraction!r}")
        if not (isinstance(self.norm_quantile, (int, float, np.floating)) and 0.0 < self.norm_quantile <= 1.0):
            raise ValueError(f"CertifyOptions.norm_quantile must lie in (0, 1], got {self.norm_quantile!r}")


@dataclass(frozen=True)
class CertifyResult:
    """Certificates of all groups, and the refusals (group -> :class:`NotEnoughData`)."""

    groups: dict[str, GroupCertificate]
    refused: dict[str, NotEnoughData]
    fp_budget: float
    confidence: float
    rule: str
    pool_test: str = "3 min(Anderson-Darling, Mann-Whitney, upper-tail count) p vs the rest of the pool, Holm"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __getitem__(self, group: str) -> GroupCertificate:
        if group in self.groups:
            return self.groups[group]
        if group in self.refused:
            raise self.refused[group]
        raise KeyError(f"no group {group!r}; groups are {sorted(self.groups) + sorted(self.refused)}")

    def __len__(self) -> int:
        return len(self.groups) + len(self.refused)


# --------------------------------------------------------------------------- certify
def certify(
    stats: Any,
    group: Any = None,
    *,
    fp_budget: float,
    confidence: float = 0.95,
    cluster: Any = None,
    covariates: Any = None,
    floor: Any = 0.0,
    upper: Mapping[str, float] | None = None,
    on_refusal: str = "raise",
    options: CertifyOptions | None = None,
) -> CertifyResult:
    """Thresholds on the combined score ``S = max_j T_j / q_j`` for many groups at once.

    Parameters
    ----------
    stats : mapping str -> array_like, or array_like (runs, statistics)
        Per-run statistics of correct runs, all groups together. NaN = not applicable (a
        statistic NaN in every run of a group is left out of that group's score). An
        infinite value (non-finite output) is an error: calibration runs must be correct.
    group : array_like or pandas.Categorical, optional
        Group label per run, 1-D (default: one group ``"all"``). Results are keyed by
        ``str(label)``. A :class:`pandas.Categorical` is grouped by its codes (no hashing
        of every run's label).
    fp_budget : float
        Largest acceptable probability that a correct run's check fails.
    confidence : float
        Confidence of the PAC promise.
    cluster : array_like, optional
        Cluster label per run (e.g. ``case``); each cluster of a group is one unit.
    covariates : optional
        Per-run covariates used to tell exact duplicate runs apart (see
        :func:`~tolstat.calibration.units.collapse`).
    floor : float or mapping str -> float
        Resolution floor per statistic, in the statistic's units: a run whose every
        statistic is at or below its floor must pass (a correctly rounded output). The
        threshold on ``S`` is at least ``max_j floor_j / q_j``; raising a threshold only
        lowers the false-positive rate, so every promise survives. Also the normaliser of a
        statistic that is zero on the whole fitting part.
    upper : mapping str -> float, optional
        Largest value each statistic can take (e.g. ``sqrt(n)`` for a bias z). A threshold
        at or above ``upper_j / q_j`` is flagged and warned about (that statistic can never
        fail the check).
    on_refusal : {"raise", "record"}
        Raise the first :class:`NotEnoughData`, or record refusals in
        :attr:`CertifyResult.refused`.
    options : CertifyOptions, optional
        The threshold rule, pooling, the fitting split and the normalisers: see
        :class:`CertifyOptions` (default ``CertifyOptions()``).

    Returns
    -------
    CertifyResult

    Raises
    ------
    NotEnoughData
        A group has too few units (with ``on_refusal="raise"``).
    ValueError
        Bad budget, confidence, statistics, labels or floors.
    TypeError
        ``options`` is not a :class:`CertifyOptions`.

    Notes
    -----
    Promises (exact wording in each :attr:`~tolstat.calibration.certificate.GroupCertificate.guarantee`):

    * ``order_statistic``: ``P(true FP rate > fp_budget) <= 1 - confidence`` over
      calibrations, for i.i.d. units. Conditional on A the scores of B are i.i.d.; the
      threshold is the smallest rank ``r`` with ``binom.cdf(r-1, n_B, 1-a) >= confidence``.
    * ``pooled_order_statistic``: the same promise for the pooled scores; it holds for the
      group when its scores are exchangeable with the pool's. That is tested (two-sided
      Anderson-Darling and Mann-Whitney tests and a one-sided upper-tail count test of the
      group's scores against the rest of the pool, Holm
      over the pool's groups, groups rejected are left out of the pool and refused if
      they needed it), not proved. An ``exact`` group is a member of a shared-normaliser
      pool, tested like the others: its zeros are pooled scores when it is kept. A group
      rejected for higher scores still lends them to a shared pool too short without them,
      where that keeps the threshold within
      :data:`~tolstat.calibration.pooling.LEND_MAX_RAISE` times the pool's largest score
      (:func:`tolstat.calibration.pooling._lenders`). Normalisers in a pool are shared,
      fitted on the union of the members' fitting parts, so pooled scores are comparable
      exactly as the statistics are (e.g. already in units of the noise model).
    * ``pooled_order_statistic`` flagged ``weakly_tested`` (own normalisers, fewer than
      ``min_test_units`` positive scores): the same promise under the same assumption, which
      the test can barely check; and, with no assumption on the tail, ``P(true FP rate >
      1 - (1 - confidence)^(1/n_B)) <= 1 - confidence``, the threshold being at least the
      largest of its ``n_B`` calibration scores.
    * ``exact``: all units of the group are exactly zero; the threshold is the resolution
      floor; no probabilistic promise beyond what was seen.
    * ``conformal``: ``P(fail) <= fp_budget`` averaged over calibration sets (marginal).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> t = {"op_max": np.abs(rng.standard_normal(400)), "op_rms": rng.exponential(size=400)}
    >>> res = certify(t, fp_budget=0.01)
    >>> c = res["all"]
    >>> c.method, c.n_fit + c.n_cal
    ('order_statistic', 400)
    >>> bool(c.passes({"op_max": 0.1, "op_rms": 0.1}))
    True
    >>> certify(t, fp_budget=0.01, options=CertifyOptions(seed=1))["all"].n_cal
    320
    """
    a = _validate.budget("fp_budget", fp_budget, lo=_validate.MIN_BUDGET / 8)
    g = _unit_interval("confidence", confidence)
    if on_refusal not in ("raise", "record"):
        raise ValueError(f"on_refusal must be 'raise' or 'record', got {on_refusal!r}")
    o = CertifyOptions() if options is None else options
    if not isinstance(o, CertifyOptions):
        raise TypeError(f"options must be a CertifyOptions, got {type(o).__name__}")
    m, names = _checked_stats(stats)
    glab, clab, cov = _labels(group, cluster, covariates, m.shape[0])
    floors = _per_stat("floor", floor, names, 0.0)
    if (floors < 0).any():
        raise ValueError(f"floor must be >= 0, got {floor!r}")
    ctx = _Ctx(a=a, g=g, rule=o.rule, names=names, floors=floors, uppers=_per_stat("upper", upper, names, math.inf),
               clusters_declared=clab is not None, seed=o.seed, norm_quantile=o.norm_quantile,
               own_pool=o.pooling and o.pool_normalisers == "own", accept_outliers=o.accept_outliers)
    ctx.info = _group_infos(ctx, m, glab, clab, cov, o.pool_by, o.fit_fraction, o.min_fit, o.max_fit)
    small = _own_thresholds(ctx)
    if small and o.pooling and o.rule == "order_statistic":
        members: dict[Any, list[str]] = {}
        need: dict[Any, list[str]] = {}
        own = o.pool_normalisers == "own"
        for gn, d in ctx.info.items():  # one pass: linear in the number of groups
            # an exact group (every unit 0) is a member of a shared-normaliser pool like any
            # other: tested, and its zeros are pooled scores when the test keeps it (in a pool
            # of exchangeable groups that are mostly correctly rounded, one of them is all
            # zeros by chance, and leaving it out left the others short of the units they
            # need); an own-normaliser pool pools positive scores only, so it has none to lend
            if not (d["exact"] and own):
                members.setdefault(d["key"], []).append(gn)
        for s in small:
            need.setdefault(ctx.info[s]["key"], []).append(s)
        for key, need_here in need.items():
            _pool(ctx, members.get(key, []), need_here, min_fit=o.min_fit, min_pool=o.min_pool,
                  min_test_units=o.min_test_units, pool_alpha=o.pool_alpha, own=o.pool_normalisers == "own")
    else:
        for s in small:
            _refuse_unpooled(ctx, s, o.pooling)
    if ctx.refused and on_refusal == "raise":
        raise next(iter(ctx.refused.values()))
    ordered = {gn: ctx.certs[gn] for gn in ctx.info if gn in ctx.certs}
    return CertifyResult(ordered, {gn: ctx.refused[gn] for gn in ctx.info if gn in ctx.refused}, a, g, o.rule)


def _checked_stats(stats: Any) -> tuple[np.ndarray, tuple[str, ...]]:
    """The statistics matrix, rejecting empty, infinite and negative values."""
    m, names = _as_matrix(stats)
    if m.shape[0] == 0:
        raise ValueError("stats has no runs")
    if np.isinf(m).any():
        bad = names[int(np.flatnonzero(np.isinf(m).any(axis=0))[0])]
        raise ValueError(f"{int(np.isinf(m).sum())} calibration statistic(s) are infinite (first in {bad!r}): "
                         "a non-finite output; calibration runs must be correct")
    if (m < 0).any():
        raise ValueError("statistics must be nonnegative (use |bias| or a one-sided statistic)")
    return m, names


def _label_array(x: Any) -> np.ndarray:
    """Labels as an array: a numpy array of strings, integers or booleans as it is (their
    grouping hashes or sorts natively, :func:`tolstat._base.util.factorize`), anything
    else as Python objects (mixed types are not coerced to one)."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "USiub":
        return x
    import pandas as pd  # comes with xarray

    if isinstance(x, pd.Categorical):
        if (x.codes < 0).any():
            raise ValueError(f"group has {int((x.codes < 0).sum())} missing label(s)")
        return x
    return np.asarray(x, dtype=object)


def _labels(group: Any, cluster: Any, covariates: Any, n: int) -> tuple[np.ndarray, Any, Any]:
    """Group labels, cluster labels and the covariate matrix, validated against ``n`` runs."""
    glab = np.full(n, "all") if group is None else _label_array(group)
    if glab.ndim != 1:
        raise ValueError(f"group must be one label per run (1-D; join multi-key labels into one string), "
                         f"got shape {glab.shape}")
    if glab.size != n:
        raise ValueError(f"group has {glab.size} labels for {n} runs")
    clab = None if cluster is None else _label_array(cluster).ravel()
    if clab is not None and clab.size != n:
        raise ValueError(f"cluster has {clab.size} labels for {n} runs")
    cov = None
    if isinstance(covariates, np.ndarray) and covariates.ndim == 1 and covariates.dtype.kind in "iub":
        if covariates.size != n:
            raise ValueError(f"covariates have {covariates.size} runs, stats have {n}")
        cov = covariates  # coded covariates: kept as integers (fast path)
    elif covariates is not None:
        cc = _covariate_columns(covariates, n)
        cov = np.empty((n, len(cc)), dtype=object)
        for j, c in enumerate(cc):
            for i, x in enumerate(c):
                cov[i, j] = x
    return glab, clab, cov


def _group_rows(glab: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    """``(group, row indices)`` in order of first appearance (:func:`rows_by_code`)."""
    if isinstance(glab, np.ndarray):
        names, inv = factorize(glab)
    else:  # a pandas.Categorical (:func:`_label_array`): its codes as they are
        names, inv = np.asarray(glab.categories, dtype=object), np.asarray(glab.codes, dtype=np.int64)
    rows = rows_by_code(inv, names.size)  # each group's rows ascending: its first row leads
    present = [j for j in range(names.size) if rows[j].size]
    first = np.array([rows[j][0] for j in present], dtype=np.int64)
    return [(names[present[j]], rows[present[j]]) for j in np.argsort(first, kind="stable")]


def _group_infos(ctx: _Ctx, m: np.ndarray, glab: np.ndarray, clab: Any, cov: Any, pool_by: Any,
                 fit_fraction: float, min_fit: int, max_fit: int) -> dict[str, dict[str, Any]]:
    """Per group: units, active statistics, the A/B split and its own normalisers."""
    info: dict[str, dict[str, Any]] = {}
    nmin = ctx.nmin
    for gname, sel in _group_rows(glab):
        u = collapse(m[sel], cluster=None if clab is None else clab[sel],
                     covariates=None if cov is None else cov[sel], names=ctx.names, copy=False)
        active, none = statistic_layout(u.values)
        v = u.values if active.all() else u.values[:, active]  # read only from here on
        if none:
            raise ValueError(f"group {gname}: {none} unit(s) have no applicable statistic (all NaN)")
        an = tuple(str(x) for x in np.asarray(ctx.names)[active])
        nA = fit_size(u.n, v.shape[1], nmin, fit_fraction=fit_fraction, min_fit=min_fit, max_fit=max_fit)
        if ctx.own_pool and u.n - 1 < nmin and u.n >= 2:
            # a small group may pool with its own normalisers: they must come from units that
            # do not give its pooled scores (even for one statistic), and enough of them (a
            # third) that their noise does not make exchangeable groups look different
            nA = max(nA, 1, min(max_fit, u.n // 3))
        iA, iB = split_units(u.n, nA, ctx.seed)
        fitpart = v if nA == 0 else v[iA]
        if ctx.own_pool and u.n - 1 < nmin and (np.nanmax(fitpart, axis=1) > 0).any():
            # the pool compares the positive scores of groups that differ in their share of
            # exact runs: balance the statistics on the positive units of A only
            fitpart = fitpart[np.nanmax(fitpart, axis=1) > 0]
        # one statistic: the score is the statistic itself (q = 1), so the threshold is in the
        # statistic's own units, the number a check compares (tolstat.calibration.decision)
        q = np.ones(1) if v.shape[1] == 1 else fit_normalisers(
            fitpart, quantile=ctx.norm_quantile, resolution=dict(zip(an, ctx.floors[active])), names=an)
        info[str(gname)] = dict(units=u, v=v, names=an, active=active, exact=bool(np.nanmax(v) == 0.0), iA=iA,
                                iB=iB, q=q, key=None if pool_by is None else pool_by.get(gname, pool_by.get(str(gname))))
    return info


def _ranked(s: np.ndarray, r: int) -> np.ndarray:
    """``s`` partitioned so that positions ``r - 2`` and ``r - 1`` (1-based ranks ``r - 1`` and
    ``r``) hold what ``numpy.sort(s)`` holds there: all that the threshold and the outlier
    flag read, in linear time rather than a sort."""
    kth = [k for k in (r - 2, r - 1) if 0 <= k < s.size]
    return np.partition(s, kth) if kth else s


def _stable_rank_index(s: np.ndarray, value: float, r: int) -> int:
    """The index of the run at 1-based rank ``r`` in the stable ascending order of ``s``
    (``numpy.argsort(s, kind="stable")[r - 1]``), given its value: among the runs tied at
    ``value``, the one at position ``r - #(s < value)``, by index."""
    return int(np.flatnonzero(s == value)[r - 1 - int(np.count_nonzero(s < value))])


def _top_scores(s: np.ndarray) -> tuple[float, ...]:
    """The :data:`TOP_SCORES` largest of ``s``, descending (one partition, a sort of the few)."""
    k = min(TOP_SCORES, s.size)
    top = np.partition(s, s.size - k)[s.size - k:] if k else s[:0]
    return tuple(float(x) for x in np.sort(top)[::-1])


def _own_thresholds(ctx: _Ctx) -> list[str]:
    """Certify every group that can stand alone (exact or enough units); return the others."""
    a, g, nmin, rule = ctx.a, ctx.g, ctx.nmin, ctx.rule
    small: list[str] = []
    for gname, d in ctx.info.items():
        u, v, iB, q, an = d["units"], d["v"], d["iB"], d["q"], d["names"]
        nB = iB.size
        if d["exact"] and nB < nmin:
            _finish(ctx, gname, 0.0, "exact", (
                f"not the budget {a:g}: all {u.n} independent units had every statistic exactly 0 (an exact op), "
                f"fewer than the {nmin} the budget needs; the threshold is the resolution floor, so a correctly "
                "rounded output passes and any error above the floor fails. Distribution-free: with probability "
                f">= {g:g} the share of correct runs above the floor is <= {_max_bound(u.n, g):.3g} (none of "
                f"{u.n} independent units was)"), q, an, 0, 0,
                f"exact: all {u.n} units exactly 0; {nmin} would be needed for the {rule.replace('_', ' ')}")
            continue
        if nB < nmin:
            small.append(gname)
            continue
        s = unit_scores(v, q, iB)
        r = ctx.rank_of(nB)
        ss = _ranked(s, r)
        thr = float(ss[r - 1])
        with np.errstate(invalid="ignore"):
            top_stat = an[int(np.nanargmax(v[iB[_stable_rank_index(s, thr, r)]] / q))] \
                if len(an) > 1 and thr > 0 else None
        odd = _outlier_flags(ctx, gname, ss, r, _score_floor(ctx, d, q), top_stat)
        if rule == "order_statistic":
            guar = _guarantee_pac(a, g, nB, r, clusters=ctx.clusters_declared)
            reason = (f"order statistic: {nB} calibration units >= {nmin} needed for budget {a:g} at "
                      f"confidence {g:g}" + (f"; {int(d['iA'].size)} units fitted the normalisers" if v.shape[1] > 1
                                             else ""))
        else:
            guar = (f"marginal (split conformal): P(check of a new correct run fails) <= {a:g} averaged over "
                    "calibration sets; no confidence level; assumes exchangeable units")
            reason = f"split conformal: rank ceil((n+1)(1-a)) = {r} of {nB} scores"
        top = _top_scores(s) if rule == "order_statistic" else ()
        _finish(ctx, gname, thr, rule, guar, q, an, r, nB, reason, top=top, extra_flags=odd)
    return small


def _refuse_unpooled(ctx: _Ctx, s: str, pooling: bool) -> None:
    d = ctx.info[s]
    why = ("pooling is off" if not pooling else
           "the conformal rule is not pooled" if ctx.rule != "order_statistic" else "")
    ctx.refuse(s, f"{d['iB'].size} calibration units < {ctx.nmin} needed for the {ctx.rule.replace('_', ' ')} at "
               f"budget {ctx.a:g}" + (f" and confidence {ctx.g:g}" if ctx.rule == "order_statistic" else "")
               + (f"; {why}" if why else ""), ctx.need(d))
