"""Certified calibration: per-run statistics -> one combined score -> a threshold with a stated promise.

This layer works on plain arrays. Its input is, per group (e.g. an (op, dtype, hardware)
cell), a few per-run *check statistics* ``T_j`` (e.g. the maximum, RMS and bias of the
normalised error of one kernel output); its output is, per group, a set of normalisers
``q_j`` and one threshold on the combined score

.. math:: S = \\max_j T_j / q_j ,

with the promise of the path that produced it, stated exactly (:attr:`GroupCertificate.guarantee`).
One combined score is calibrated with the full budget: no budget is split between statistics.

Steps, per group:

1. **Units** (:func:`collapse`). Exact duplicate runs (identical statistic vectors and
   covariates) are collapsed to one run, and each declared cluster (e.g. ``case``: the same
   inputs through several correct variants) to ONE unit, its per-statistic maximum. The
   maximum is conservative for any member: a run of any variant has ``S`` at most its
   unit's ``S``. Independence is *assumed across* units (clusters), never within.
2. **Split** (:func:`split_units`, :func:`fit_size`). A deterministic seeded split of the
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

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats as _st

from tolstat._base.inference import clopper_pearson_upper, holm
from tolstat._base.util import NotEnoughData
from tolstat._base.validate import unit_interval as _unit_interval
from tolstat.measure.noise import combined_score
from tolstat.models.estimators.orderstat import (
    conformal_min_n,
    conformal_rank,
    order_statistic_min_n,
    order_statistic_rank,
)

__all__ = [
    "NotEnoughData",
    "UnreachableThresholdWarning",
    "Units",
    "GroupCertificate",
    "CertifyResult",
    "RULES",
    "collapse",
    "fit_size",
    "split_units",
    "fit_normalisers",
    "score",
    "union_budget",
    "certify",
]

#: threshold rules :func:`certify` accepts
RULES = ("order_statistic", "conformal")
#: calibration scores kept per group (largest first) for re-budgeting
TOP_SCORES = 256


class UnreachableThresholdWarning(UserWarning):
    """A threshold at or above the largest value a statistic can take (it can never fail)."""


# --------------------------------------------------------------------------- validation
def _as_matrix(stats: Any, names: Sequence[str] | None = None, *, what: str = "stats") -> tuple[np.ndarray, tuple[str, ...]]:
    """(runs, statistics) float64 matrix and the statistic names from a mapping or an array."""
    if isinstance(stats, Mapping):
        if not stats:
            raise ValueError(f"{what} is empty: give at least one statistic")
        keys = tuple(str(k) for k in stats)
        cols = [np.asarray(stats[k], dtype=np.float64).ravel() for k in stats]
        sizes = {c.size for c in cols}
        if len(sizes) != 1:
            raise ValueError(f"{what}: statistics have different numbers of runs "
                             f"{dict(zip(keys, (c.size for c in cols)))}")
        m = np.column_stack(cols) if cols[0].size else np.empty((0, len(cols)))
        if names is not None and tuple(names) != keys:
            raise ValueError(f"{what}: names {tuple(names)} do not match the mapping's keys {keys}")
        return m, keys
    m = np.asarray(stats, dtype=np.float64)
    if m.ndim == 1:
        m = m[:, None]
    if m.ndim != 2:
        raise ValueError(f"{what} must be a mapping name -> 1-D array or a 2-D array (runs, statistics), "
                         f"got an array of shape {m.shape}")
    if names is None:
        names = tuple(f"T{j}" for j in range(m.shape[1]))
    names = tuple(str(n) for n in names)
    if len(names) != m.shape[1]:
        raise ValueError(f"{what}: {len(names)} names for {m.shape[1]} statistic columns")
    return m, names


def _per_stat(name: str, v: Any, names: Sequence[str], default: float) -> np.ndarray:
    """A float or a mapping name -> float, as an array aligned with ``names``."""
    if v is None:
        return np.full(len(names), default)
    if isinstance(v, Mapping):
        unknown = set(map(str, v)) - set(names)
        if unknown:
            raise ValueError(f"{name} names unknown statistics {sorted(unknown)}; statistics are {list(names)}")
        out = np.array([float(v.get(n, default)) for n in names])
    else:
        out = np.full(len(names), float(v))
    if np.isnan(out).any():
        raise ValueError(f"{name} must not be NaN, got {v!r}")
    return out


# --------------------------------------------------------------------------- units
@dataclass(frozen=True)
class Units:
    """Independent units of one group, after collapsing duplicates and clusters.

    Attributes
    ----------
    values : numpy.ndarray, shape (n_units, n_statistics)
        Per-unit statistics (a cluster's per-statistic maximum; NaN = not applicable).
    names : tuple of str
        Statistic names (columns of ``values``).
    n_runs : int
        Runs given.
    n_duplicates : int
        Runs dropped as exact duplicates of an earlier run (same statistics and covariates).
    n_clusters : int or None
        Clusters formed (``None`` when no cluster label was given: each run is a unit).
    """

    values: np.ndarray
    names: tuple[str, ...]
    n_runs: int
    n_duplicates: int
    n_clusters: int | None

    @property
    def n(self) -> int:
        """Number of independent units."""
        return int(self.values.shape[0])


def _canonical_rows(m: np.ndarray) -> np.ndarray:
    """Rows as hashable bytes, with -0.0 -> 0.0 and one NaN bit pattern."""
    c = np.where(np.isnan(m), np.nan, m + 0.0)
    return np.ascontiguousarray(c).view(np.dtype((np.void, c.dtype.itemsize * c.shape[1]))).ravel()


def _covariate_columns(covariates: Any, n: int) -> list[list[Any]]:
    """Covariates (mapping name -> values, or an array (runs,) / (runs, k)) as hashable columns."""
    if isinstance(covariates, Mapping):
        cols = []
        for v in covariates.values():
            if isinstance(v, np.ndarray) and v.ndim == 1:
                cols.append(v if v.dtype.kind in "iub" else v.astype(object))
                continue
            lst = list(v)
            c = np.empty(len(lst), dtype=object)
            for i, x in enumerate(lst):
                c[i] = x
            cols.append(c)
    elif isinstance(covariates, np.ndarray) and covariates.ndim == 1 and covariates.dtype.kind in "iub":
        cols = [covariates]
    else:
        a = np.asarray(covariates, dtype=object)
        a = a[:, None] if a.ndim == 1 else a
        if a.ndim != 2:
            raise ValueError(f"covariates must be a mapping or an array (runs,) or (runs, k), got shape {a.shape}")
        cols = [a[:, j] for j in range(a.shape[1])]
    for c in cols:
        if c.size != n:
            raise ValueError(f"covariates have {c.size} runs, stats have {n}")
    return [c.tolist() if _is_int_column(c) else [_hashable(x) for x in c] for c in cols]


def _is_int_column(c: np.ndarray) -> bool:
    """An integer/bool column (hashable as is: the fast path for coded covariates)."""
    return isinstance(c, np.ndarray) and c.dtype.kind in "iub"


def _hashable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return (x.shape, tuple(x.ravel().tolist()))
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(y) for y in x)
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def collapse(stats: Any, *, cluster: Any = None, covariates: Any = None,
             names: Sequence[str] | None = None) -> Units:
    """Collapse exact duplicate runs and declared clusters into independent units.

    Parameters
    ----------
    stats : mapping str -> array_like, or array_like of shape (runs, statistics)
        Per-run statistics. NaN marks a statistic that does not apply to a run.
    cluster : array_like, optional
        One label per run; runs with the same label (e.g. the same inputs through several
        correct variants) are dependent and become ONE unit, their per-statistic maximum
        (``nanmax``; NaN only if no member has the statistic).
    covariates : mapping str -> array_like, or array_like (runs,) or (runs, k), optional
        Per-run covariates of any kind (e.g. shape tuples, dtype names, seeds, an input
        hash). Two runs are exact duplicates when
        their covariates AND statistics are identical; the later one is dropped. Without
        covariates no run is dropped: equal statistics alone are normal (ties on an ULP
        lattice, exact ops) and are no evidence of a repeated run.
    names : sequence of str, optional
        Statistic names when ``stats`` is an array.

    Returns
    -------
    Units

    Notes
    -----
    Guarantee: thresholds built from the units assume independence **across** units
    (clusters), not within a cluster. A cluster's maximum bounds each member's statistic,
    so a threshold valid for a new unit is valid for a new run of any member variant.
    Duplicates are removed before clustering (the first occurrence is kept). Repeated
    runs that are not exact copies (e.g. the same inputs through another variant) must be
    declared with ``cluster``.
    """
    m, keys = _as_matrix(stats, names)
    n = m.shape[0]
    if n == 0:
        raise ValueError("stats has no runs")
    keep = np.arange(n)
    if covariates is not None:
        cols = _covariate_columns(covariates, n)
        rows = _canonical_rows(m)
        seen: dict[Any, int] = {}
        for i, k in enumerate(zip(rows.tolist(), *cols)):
            seen.setdefault(k, i)
        keep = np.fromiter(sorted(seen.values()), dtype=np.int64)
    lab = None
    if cluster is not None:
        lab = np.asarray(cluster).ravel()
        if lab.size != n:
            raise ValueError(f"cluster has {lab.size} labels for {n} runs")
    n_dup = n - keep.size
    m = m[keep]
    if lab is None:
        return Units(m, keys, n, int(n_dup), None)
    lab = lab[keep]
    uniq, inv = np.unique(lab, return_inverse=True)
    out = np.full((uniq.size, m.shape[1]), -np.inf)
    filled = np.zeros((uniq.size, m.shape[1]), dtype=bool)
    fin = ~np.isnan(m)
    for j in range(m.shape[1]):
        f = fin[:, j]
        np.maximum.at(out[:, j], inv[f], m[f, j])
        filled[inv[f], j] = True
    out[~filled] = np.nan
    return Units(out, keys, n, int(n_dup), int(uniq.size))


# --------------------------------------------------------------------------- split
def fit_size(n_units: int, n_statistics: int, n_needed: int, *, fit_fraction: float = 0.2,
             min_fit: int = 10, max_fit: int = 200) -> int:
    """Units for the fitting part A (normalisers); the rest calibrate the threshold.

    Rule: 0 with one statistic (the normaliser cannot change any order-statistic rank).
    Otherwise ``min(max(ceil(fit_fraction * n), min_fit), max_fit)``, lowered to
    ``n - n_needed`` (at least 1) when that lets B reach the ``n_needed`` units its own
    order statistic needs, and always leaving B at least one unit.

    Why this size: the normalisers only balance the statistics against each other (any
    ``q`` fitted on A keeps the promise, however few units A has); an upper quantile of 10
    units is already within a small factor, and beyond about 200 units it hardly improves
    while B loses runs. B keeps 80% or more, and when units are short A shrinks (down to
    one unit: cruder balance, same promise) rather than the group being refused.
    """
    n_units = int(n_units)
    if n_units < 1:
        raise ValueError(f"n_units must be >= 1, got {n_units}")
    if n_statistics <= 1:
        return 0
    if not (0.0 <= fit_fraction < 1.0):
        raise ValueError(f"fit_fraction must lie in [0, 1), got {fit_fraction!r}")
    if min_fit < 1 or max_fit < min_fit:
        raise ValueError(f"need 1 <= min_fit <= max_fit, got min_fit={min_fit}, max_fit={max_fit}")
    a = min(max(math.ceil(fit_fraction * n_units), min_fit), max_fit)
    if n_units - a < n_needed <= n_units - 1:
        a = n_units - n_needed
    return max(0, min(a, n_units - 1))


def split_units(n_units: int, n_fit: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic seeded split of ``range(n_units)`` into (A, B) index arrays.

    The permutation comes from ``numpy.random.default_rng([seed, n_units])``, so the same
    data and seed always give the same split.
    """
    if not (0 <= n_fit <= n_units):
        raise ValueError(f"n_fit must lie in [0, n_units={n_units}], got {n_fit}")
    if n_fit == 0:
        return np.empty(0, dtype=np.int64), np.arange(n_units)
    perm = np.random.default_rng([int(seed), int(n_units)]).permutation(n_units)
    return np.sort(perm[:n_fit]), np.sort(perm[n_fit:])


def fit_normalisers(values: np.ndarray, *, quantile: float = 1.0, resolution: Any = None,
                    names: Sequence[str] | None = None) -> np.ndarray:
    """Normalisers ``q_j``: an upper quantile of each statistic over the fitting units.

    Parameters
    ----------
    values : ndarray, shape (units, statistics)
        Statistics of the fitting part (NaN ignored).
    quantile : float, default 1.0
        Quantile level (empirical, ``method="higher"``, so ``q_j`` is an observed value;
        the default is the largest, see :func:`certify`'s ``norm_quantile``).
    resolution : float or mapping, optional
        Used where the quantile is not positive (all fitting values zero or absent): the
        resolution floor of the statistic if positive, else 1. Default: 1.

    Returns
    -------
    ndarray of float, all > 0 and finite.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"values must be 2-D (units, statistics), got shape {v.shape}")
    names = names or tuple(f"T{j}" for j in range(v.shape[1]))
    res = _per_stat("resolution", resolution, names, 1.0)
    res = np.where(res > 0, res, 1.0)
    q = np.full(v.shape[1], np.nan)
    for j in range(v.shape[1]):
        col = v[:, j]
        col = col[~np.isnan(col)]
        if col.size:
            q[j] = float(np.quantile(col, quantile, method="higher"))
    bad = ~(np.isfinite(q) & (q > 0))
    q[bad] = res[bad]
    return q


def score(stats: Any, normalisers: Mapping[str, float], *, which: bool = False) -> Any:
    """Combined score ``S = max_j T_j / q_j`` of each run (the one definition, used to calibrate and to check).

    Parameters
    ----------
    stats : mapping str -> array_like (or scalar)
        Statistics of one or more runs. Statistics without a normaliser are ignored; a
        normalised statistic missing from ``stats`` is an error.
    normalisers : mapping str -> float
        ``q_j > 0`` per statistic (:attr:`GroupCertificate.normalisers`).
    which : bool
        Also return, per run, the statistic attaining the maximum (the one that trips).

    Returns
    -------
    S : ndarray
        NaN statistics (not applicable) are skipped; ``S`` is NaN when none applies and
        ``+inf`` when a statistic is infinite (non-finite output).
    names : ndarray of str, only with ``which=True``
    """
    return combined_score(stats, normalisers, which=which)


def union_budget(total: float, k: int, *, method: str = "bonferroni", independent: bool = False) -> float:
    """Per-part budget so that ``k`` parts together keep ``total``.

    ``"bonferroni"``: ``total / k``, a true union bound (any dependence). ``"sidak"``:
    ``1 - (1 - total)**(1/k)``, exact only for independent parts: allowed only with
    ``independent=True`` (the caller states the independence).
    """
    a = _unit_interval("total", total)
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if method == "bonferroni":
        return a / int(k)
    if method == "sidak":
        if not independent:
            raise ValueError("method='sidak' is not a union bound: it holds only for independent parts; "
                             "pass independent=True to state that, or use method='bonferroni'")
        return -math.expm1(math.log1p(-a) / int(k))
    raise ValueError(f"method must be 'bonferroni' or 'sidak', got {method!r}")


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class GroupCertificate:
    """Threshold of one group on the combined score, and exactly what it promises.

    Attributes
    ----------
    group : str
    threshold : float
        A run fails when ``score(stats, normalisers) > threshold``.
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
        """:func:`score` with this group's normalisers."""
        return score(stats, self.normalisers, which=which)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict of every field (tuples as lists)."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def passes(self, stats: Mapping[str, Any]) -> np.ndarray:
        """True where a run's combined score is within the threshold (NaN score passes)."""
        s = self.score(stats)
        return ~(s > self.threshold)


@dataclass(frozen=True)
class CertifyResult:
    """Certificates of all groups, and the refusals (group -> :class:`NotEnoughData`)."""

    groups: dict[str, GroupCertificate]
    refused: dict[str, NotEnoughData]
    fp_budget: float
    confidence: float
    rule: str
    pool_test: str = "2 min(Anderson-Darling, Mann-Whitney) p vs the rest of the pool, Holm"
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


def _pool_p(x: np.ndarray, rest: np.ndarray) -> float:
    """p-value of "x is exchangeable with rest": two tests, Bonferroni-combined.

    ``2 * min(p_AD, p_MWU)`` of the two-sided k-sample Anderson-Darling test (shape and tails;
    scipy caps its p-value to [0.001, 0.25]) and the two-sided Mann-Whitney U test (location;
    uncapped, so a clear shift stays detectable under Holm with many groups). 1 without spread.
    """
    both = np.concatenate([x, rest])
    if np.unique(both).size < 2:
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p_ad = float(_st.anderson_ksamp([x, rest]).pvalue)
    p_mw = float(_st.mannwhitneyu(x, rest, alternative="two-sided").pvalue)
    return min(1.0, 2.0 * min(p_ad, p_mw))


#: quantiles of the rest of the pool above which :func:`_pool_p_shape` compares tail counts
POOL_TAIL_LEVELS = (0.9, 0.99)


def _pool_p_shape(x: np.ndarray, rest: np.ndarray) -> float:
    """p-value of "the upper tail of ``x`` is no heavier than that of ``rest``" (each group's
    level already removed).

    The pooled threshold lies in the upper tail of the pooled scores, and it keeps a
    group's promise when the group's scores exceed it no more often than the pool's: a
    group whose scores are lighter-tailed or differ only below the tail keeps it with room
    to spare. So the test is one-sided and looks at the tail only: Fisher's exact test of
    the share of ``x`` above each :data:`POOL_TAIL_LEVELS` quantile of ``rest`` against
    the share of ``rest`` there (alternative: larger), Bonferroni-combined,
    ``min(1, k min(p))``. A test of the whole distribution (Kolmogorov-Smirnov) refused
    every corpus operator at 1,500 runs per group, for differences that do not matter to
    the promise. 1 without spread.
    """
    both = np.concatenate([x, rest])
    if np.unique(both).size < 2:
        return 1.0
    ps = []
    for level in POOL_TAIL_LEVELS:
        t = float(np.quantile(rest, level, method="higher"))
        k, kr = int((x > t).sum()), int((rest > t).sum())
        ps.append(float(_st.fisher_exact([[k, x.size - k], [kr, rest.size - kr]], alternative="greater").pvalue))
    return min(1.0, len(ps) * min(ps))


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
    rule: str = "order_statistic",
    pooling: bool = True,
    pool_by: Mapping[Any, Any] | None = None,
    pool_alpha: float = 0.01,
    min_pool: int = 3,
    min_test_units: int = 8,
    seed: int = 0,
    fit_fraction: float = 0.2,
    min_fit: int = 10,
    max_fit: int = 200,
    norm_quantile: float = 1.0,
    on_refusal: str = "raise",
    pool_normalisers: str = "shared",
) -> CertifyResult:
    """Thresholds on the combined score ``S = max_j T_j / q_j`` for many groups at once.

    Parameters
    ----------
    stats : mapping str -> array_like, or array_like (runs, statistics)
        Per-run statistics of correct runs, all groups together. NaN = not applicable (a
        statistic NaN in every run of a group is left out of that group's score). An
        infinite value (non-finite output) is an error: calibration runs must be correct.
    group : array_like, optional
        Group label per run, 1-D (default: one group ``"all"``). Results are keyed by
        ``str(label)``.
    fp_budget : float
        Largest acceptable probability that a correct run's check fails.
    confidence : float
        Confidence of the PAC promise.
    cluster : array_like, optional
        Cluster label per run (e.g. ``case``); each cluster of a group is one unit.
    covariates : optional
        Per-run covariates used to tell exact duplicate runs apart (see :func:`collapse`).
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
    rule : {"order_statistic", "conformal"}
        ``order_statistic`` (default): the PAC bound. ``conformal``: the split-conformal
        rank, a *marginal* promise (no confidence level); no pooling.
    pooling : bool
        Let groups with too few units borrow the scores of exchangeable groups.
    pool_by : mapping group -> key, optional
        Groups pool only with groups of the same key (e.g. the dtype). Default: one pool.
    pool_alpha : float
        Family-wise level of the exchangeability tests (Holm over the groups of a pool): the
        largest probability of refusing some group of an exchangeable pool. Low by default
        so that exchangeable groups are rarely refused; a clear difference (e.g. scores 3x
        larger with 30 units) still gives p-values far below it.
    min_pool : int
        Fewest groups (the borrower included) a pool must have.
    min_test_units : int
        Fewest calibration units a group needs for its exchangeability test. With
        ``pool_normalisers="own"`` a group with fewer positive scores (mostly correctly
        rounded) is still tested when the test could refuse it; its threshold is then at
        least its own largest calibration score and it is flagged ``"weakly_tested"``.
    seed : int
        Seed of the A/B split (deterministic).
    fit_fraction, min_fit, max_fit : see :func:`fit_size`.
    norm_quantile : float, default 1.0
        Quantile of each statistic over A used as its normaliser; the default, the largest
        value of A, balances the statistics in their tails, where the threshold of a small
        budget lies. A bulk quantile (e.g. 0.9) under-weights nothing but lets a statistic
        that is zero on most runs (a bias of the error beyond correct rounding) get a tiny
        normaliser, and its rare large values then set a threshold at which no other
        statistic can ever fail the check.
    on_refusal : {"raise", "record"}
        Raise the first :class:`NotEnoughData`, or record refusals in
        :attr:`CertifyResult.refused`.
    pool_normalisers : {"shared", "own"}
        ``"shared"`` (default): a pool's normalisers are fitted on the union of small
        fitting parts of its members, and pooled scores are comparable as far as the
        statistics are. ``"own"``: each member's scores use its own normalisers (fitted on
        its own fitting part A, the scores from its part B), so pooled scores are in units
        of each group's own spread; exchangeability is tested in those units. Use it when
        the statistics differ in scale between groups (e.g. different operators).

    Returns
    -------
    CertifyResult

    Notes
    -----
    Promises (exact wording in each :attr:`GroupCertificate.guarantee`):

    * ``order_statistic``: ``P(true FP rate > fp_budget) <= 1 - confidence`` over
      calibrations, for i.i.d. units. Conditional on A the scores of B are i.i.d.; the
      threshold is the smallest rank ``r`` with ``binom.cdf(r-1, n_B, 1-a) >= confidence``.
    * ``pooled_order_statistic``: the same promise for the pooled scores; it holds for the
      group when its scores are exchangeable with the pool's. That is tested (two-sided
      Anderson-Darling and Mann-Whitney tests of the group's scores against the rest of the pool, Holm
      over the pool's groups, groups rejected are left out of the pool and refused if
      they needed it), not proved. Normalisers in a pool are shared, fitted on the union of
      the members' fitting parts, so pooled scores are comparable exactly as the statistics
      are (e.g. already in units of the noise model).
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
    """
    a = _unit_interval("fp_budget", fp_budget)
    g = _unit_interval("confidence", confidence)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if on_refusal not in ("raise", "record"):
        raise ValueError(f"on_refusal must be 'raise' or 'record', got {on_refusal!r}")
    _unit_interval("pool_alpha", pool_alpha)
    if pool_normalisers not in ("shared", "own"):
        raise ValueError(f"pool_normalisers must be 'shared' or 'own', got {pool_normalisers!r}")
    m, names = _checked_stats(stats)
    glab, clab, cov = _labels(group, cluster, covariates, m.shape[0])
    floors = _per_stat("floor", floor, names, 0.0)
    if (floors < 0).any():
        raise ValueError(f"floor must be >= 0, got {floor!r}")
    ctx = _Ctx(a=a, g=g, rule=rule, names=names, floors=floors, uppers=_per_stat("upper", upper, names, math.inf),
               clusters_declared=clab is not None, seed=seed, norm_quantile=norm_quantile,
               own_pool=pooling and pool_normalisers == "own")
    ctx.info = _group_infos(ctx, m, glab, clab, cov, pool_by, fit_fraction, min_fit, max_fit)
    small = _own_thresholds(ctx)
    if small and pooling and rule == "order_statistic":
        keys = {gname: ctx.info[gname]["key"] for gname in ctx.info}
        for key in dict.fromkeys(keys[s] for s in small):
            _pool(ctx, [gn for gn in ctx.info if keys[gn] == key and not ctx.info[gn]["exact"]],
                  [s for s in small if keys[s] == key], min_fit=min_fit, min_pool=min_pool,
                  min_test_units=min_test_units, pool_alpha=pool_alpha, own=pool_normalisers == "own")
    else:
        for s in small:
            _refuse_unpooled(ctx, s, pooling)
    if ctx.refused and on_refusal == "raise":
        raise next(iter(ctx.refused.values()))
    ordered = {gn: ctx.certs[gn] for gn in ctx.info if gn in ctx.certs}
    return CertifyResult(ordered, {gn: ctx.refused[gn] for gn in ctx.info if gn in ctx.refused}, a, g, rule)


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


def _labels(group: Any, cluster: Any, covariates: Any, n: int) -> tuple[np.ndarray, Any, Any]:
    """Group labels, cluster labels and the covariate matrix, validated against ``n`` runs."""
    glab = np.full(n, "all", dtype=object) if group is None else np.asarray(group, dtype=object)
    if glab.ndim != 1:
        raise ValueError(f"group must be one label per run (1-D; join multi-key labels into one string), "
                         f"got shape {glab.shape}")
    if glab.size != n:
        raise ValueError(f"group has {glab.size} labels for {n} runs")
    clab = None if cluster is None else np.asarray(cluster, dtype=object).ravel()
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


@dataclass
class _Ctx:
    """Shared state of one :func:`certify` call."""

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


def _group_infos(ctx: _Ctx, m: np.ndarray, glab: np.ndarray, clab: Any, cov: Any, pool_by: Any,
                 fit_fraction: float, min_fit: int, max_fit: int) -> dict[str, dict[str, Any]]:
    """Per group: units, active statistics, the A/B split and its own normalisers."""
    info: dict[str, dict[str, Any]] = {}
    nmin = ctx.nmin
    for gname in dict.fromkeys(glab.tolist()):
        sel = glab == gname
        u = collapse(m[sel], cluster=None if clab is None else clab[sel],
                     covariates=None if cov is None else cov[sel], names=ctx.names)
        active = ~np.isnan(u.values).all(axis=0)
        v = u.values[:, active]
        if np.isnan(v).all(axis=1).any():
            raise ValueError(f"group {gname}: {int(np.isnan(v).all(axis=1).sum())} unit(s) have no applicable "
                             "statistic (all NaN)")
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
        s = np.nanmax(v[iB] / q, axis=1)
        r = ctx.rank_of(nB)
        thr = float(np.sort(s)[r - 1])
        if rule == "order_statistic":
            guar = _guarantee_pac(a, g, nB, r, clusters=ctx.clusters_declared)
            reason = (f"order statistic: {nB} calibration units >= {nmin} needed for budget {a:g} at "
                      f"confidence {g:g}" + (f"; {int(d['iA'].size)} units fitted the normalisers" if v.shape[1] > 1
                                             else ""))
        else:
            guar = (f"marginal (split conformal): P(check of a new correct run fails) <= {a:g} averaged over "
                    "calibration sets; no confidence level; assumes exchangeable units")
            reason = f"split conformal: rank ceil((n+1)(1-a)) = {r} of {nB} scores"
        top = tuple(float(x) for x in np.sort(s)[::-1][:TOP_SCORES]) if rule == "order_statistic" else ()
        _finish(ctx, gname, thr, rule, guar, q, an, r, nB, reason, top=top)
    return small


def _refuse_unpooled(ctx: _Ctx, s: str, pooling: bool) -> None:
    d = ctx.info[s]
    why = ("pooling is off" if not pooling else
           "the conformal rule is not pooled" if ctx.rule != "order_statistic" else "")
    ctx.refuse(s, f"{d['iB'].size} calibration units < {ctx.nmin} needed for the {ctx.rule.replace('_', ' ')} at "
               f"budget {ctx.a:g}" + (f" and confidence {ctx.g:g}" if ctx.rule == "order_statistic" else "")
               + (f"; {why}" if why else ""), ctx.need(d))


def _pool_fit_sizes(sizes: list[int], n_stats: int, min_fit: int, nmin: int) -> list[int]:
    """Fitting units per pool member: ``min_fit`` in all (fewer, down to 1, when that lets the
    pool reach ``nmin``; none with one statistic), dealt round-robin."""
    kfit = [0] * len(sizes)
    if n_stats <= 1:
        return kfit
    total = sum(sizes)
    tf = min_fit if not (total - min_fit < nmin <= total - 1) else total - nmin
    tf = min(tf, total - len(sizes))
    i = 0
    while sum(kfit) < tf:
        if kfit[i] < sizes[i] - 1:
            kfit[i] += 1
        i = (i + 1) % len(sizes)
    return kfit


def _pool_scores(ctx: _Ctx, members: list[str], cols: list[int], names_union: tuple[str, ...],
                 kfit: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    """Shared normalisers of a pool and each member's pooled scores (and calibration sizes)."""
    fitparts, calparts = {}, {}
    for gn, kA in zip(members, kfit):
        full = ctx.info[gn]["units"].values[:, cols]
        iA, iB = split_units(full.shape[0], kA, ctx.seed)
        fitparts[gn], calparts[gn] = full[iA], full[iB]
    if len(cols) <= 1:
        fitparts = {gn: ctx.info[gn]["units"].values[:, cols] for gn in members}
    qP = np.ones(1) if len(cols) <= 1 else fit_normalisers(
        np.vstack(list(fitparts.values())), quantile=ctx.norm_quantile,
        resolution=dict(zip(names_union, ctx.floors[cols])), names=names_union)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scores = {gn: np.nanmax(calparts[gn] / qP, axis=1) for gn in members}
    return qP, scores, {gn: int(calparts[gn].shape[0]) for gn in members}


def _own_positive_scores(ctx: _Ctx, members: list[str], level: float) -> dict[str, np.ndarray]:
    """Each member's positive part-B scores in units of its own level (``pool_normalisers="own"``).

    ``S`` under the member's own normalisers; its positive part-B scores as ``log S - loc``
    with ``loc`` the median of ``log S`` over the member's positive units (both parts, so
    that it is as precise as the group's data allow), stored in ``ctx.info[g]`` with
    ``loc_upper`` (a distribution-free upper confidence bound of that median at ``level``,
    an order statistic; NaN when too few units are positive) and ``n_pos`` (inexact units
    of both parts: whether a score is positive does not depend on the fitted normalisers,
    so every unit informs the share of inexact runs). Zero scores (correctly rounded runs) are left out: how often a group's
    runs are exact differs between operators and is bounded per group (:func:`_pool_own`).
    """
    out = {}
    for gn in members:
        d = ctx.info[gn]
        s_all = np.nanmax(d["v"] / d["q"], axis=1)
        lp = np.sort(np.log(s_all[s_all > 0]))
        d["loc"] = float(np.median(lp)) if lp.size else 0.0
        d["loc_upper"] = (float(lp[int(order_statistic_rank(lp.size, 0.5, level)[0]) - 1])
                          if lp.size >= order_statistic_min_n(0.5, level) else math.nan)
        sB = s_all[d["iB"]]
        d["n_pos"] = int((s_all > 0).sum())  # inexact units of both parts: S > 0 does not depend on q
        out[gn] = np.log(sB[sB > 0]) - d["loc"]
    return out


def _can_refuse(x: np.ndarray, rest: np.ndarray, test: Any, n_tests: int, pool_alpha: float) -> bool:
    """Whether ``test`` could refuse ``x.size`` scores at ``pool_alpha`` after Holm over
    ``n_tests`` groups: its p-value when every score lies above all of ``rest`` (the most
    extreme sample of that size), times ``n_tests`` (Holm's first step), is at most ``pool_alpha``."""
    if x.size == 0 or rest.size == 0:
        return False
    return n_tests * test(np.full(x.size, float(np.max(rest)) + 1.0), rest) <= pool_alpha


def _pool_members(scores: Mapping[str, np.ndarray], members: list[str], test: Any, min_test_units: int,
                  pool_alpha: float, few: bool = False) -> tuple[dict[str, float], list[str]]:
    """Holm-adjusted p-values of ``test(member's scores, rest of the pool)`` for the members
    with at least ``min_test_units`` scores (``few``: or fewer, when the test could still
    refuse them, :func:`_can_refuse`), and the members not rejected at ``pool_alpha``."""
    def rest(gn: str) -> np.ndarray:
        return np.concatenate([scores[h] for h in members if h != gn])

    testable = [gn for gn in members if scores[gn].size >= min_test_units
                or (few and _can_refuse(scores[gn], rest(gn), test, len(members), pool_alpha))]
    raw_p = np.array([test(scores[gn], rest(gn)) for gn in testable])
    adj = dict(zip(testable, holm(raw_p)))
    return adj, [gn for gn in members if gn in adj and adj[gn] > pool_alpha]


def _pool_own(ctx: _Ctx, members: list[str], need_here: list[str], *, min_pool: int, min_test_units: int,
              pool_alpha: float) -> None:
    """Pooled thresholds of a pool of different operators (``pool_normalisers="own"``).

    A new run of group ``g`` fails when its score is positive and, given that, beyond the
    threshold: ``P(fail) = pi_g * P(S > t | S > 0)``. ``pi_g`` (the share of inexact runs)
    differs between operators and is bounded from all the group's own units (Clopper-Pearson,
    one-sided). The positive scores, each group's relative to its own median level
    (:func:`_own_positive_scores`), are pooled and tested for exchangeability
    (:func:`_pool_p_shape`, Holm); the threshold is ``exp(loc_upper + t)``, with ``t`` the
    pooled order statistic at the conditional budget ``fp_budget / pi_upper`` and
    ``loc_upper`` an upper confidence bound of the group's median level (its estimate
    from few units would otherwise shift the group against the pool). The three bounds
    each hold with probability ``1 - (1 - confidence) / 3``, together with probability
    ``>= confidence`` (union bound), and then ``P(fail) <= pi_upper * fp_budget / pi_upper``.
    A group with fewer than ``min_test_units`` positive scores in B is tested on them when
    the test could refuse it (:func:`_can_refuse`); its threshold is then at least its own
    largest part-B score, so its rate is at most :func:`_max_bound` whatever its tail.
    Shown by simulation in ``tests/test_certify_own_pool_sim.py``.
    """
    a, g = ctx.a, ctx.g
    third = (1.0 - g) / 3.0
    scores = _own_positive_scores(ctx, members, 1.0 - third)
    adj, ok = _pool_members(scores, members, _pool_p_shape, min_test_units, pool_alpha, few=True)
    pooled = np.sort(np.concatenate([scores[gn] for gn in ok])) if ok else np.empty(0)
    for s in need_here:
        d = ctx.info[s]
        nB, nU, k = int(d["iB"].size), int(d["units"].n), int(d["n_pos"])
        pi_u = clopper_pearson_upper(k, nU, 1.0 - third)
        a_c = min(1.0, a / pi_u)
        if a_c < 1.0 and _pool_refusal(ctx, s, adj, pooled, ok, min_pool, min_test_units, pool_alpha,
                                       need_n=order_statistic_min_n(1.0 - a_c, 1.0 - third)):
            continue
        if a_c >= 1.0:
            t, r, thr = -math.inf, 0, 0.0
        else:
            if not math.isfinite(d["loc_upper"]):
                ctx.refuse(s, f"{nB} calibration units < {ctx.nmin} needed, and too few inexact units to bound "
                           "its level for pooling", ctx.need(d))
                continue
            r = int(order_statistic_rank(pooled.size, 1.0 - a_c, 1.0 - third)[0])
            t = float(pooled[r - 1])
            thr = math.exp(d["loc_upper"] + t)
        weak, own_max = "", ""
        if a_c < 1.0 and scores[s].size < min_test_units:
            # few inexact units: the test refuses only a far heavier tail, so the threshold is
            # at least the group's own largest calibration score, whose promise needs no pool
            s_own = float(np.nanmax(d["v"][d["iB"]] / d["q"], axis=1).max())
            if s_own > thr:
                thr, own_max = s_own, f"; raised to its own largest calibration score {s_own:.6g}"
            weak = (f" The test ran on only {scores[s].size} positive scores (fewer than min_test_units = "
                    f"{min_test_units}): it refuses only a tail far heavier than the pool's. Whatever its tail, the "
                    f"threshold is at least the largest of the group's own {nB} calibration scores (independent "
                    f"of its normalisers), so with probability >= {g:g} the rate is <= "
                    f"{_max_bound(nB, g):.3g} (distribution-free: the largest of {nB} independent units).")
        guar = (f"PAC: with probability >= {g:g} over the calibration units, the probability that the check of a "
                f"new correct {'cluster' if ctx.clusters_declared else 'run'} fails is <= {a:g}, as the product of "
                f"the group's share of inexact runs (<= {pi_u:.3g}: Clopper-Pearson bound from {k} of its own {nU} "
                f"units) and the pooled conditional bound at budget {a_c:.3g} (the {r}-th smallest of {pooled.size} "
                f"pooled positive scores, each group's in units of its own median level; the group's level taken "
                f"at an upper confidence bound of its median), three bounds each at confidence {1 - third:.4g} "
                f"(union bound). Assumes independent, identically distributed units, and holds only if the "
                f"group's positive scores, relative to its level, exceed the pooled threshold no more often than "
                f"the pool's: tested (one-sided tail counts above the 0.9 and 0.99 quantiles of the rest of the "
                f"pool, Holm-adjusted p = {adj[s]:.3g} > {pool_alpha:g}), not proved." + weak)
        reason = (f"pooled order statistic: own {nB} calibration units < {ctx.nmin} needed; {k} of its {nU} units "
                  f"inexact; "
                  f"borrowed {pooled.size} positive scores of {len(ok)} exchangeable groups (each with its own "
                  "normalisers and level)"
                  + (f"; tested on only {scores[s].size} positive scores{own_max}" if weak else ""))
        _finish(ctx, s, thr, "pooled_order_statistic", guar, d["q"], d["names"], r, pooled.size, reason,
                pool=tuple(ok), pool_p=float(adj[s]), split=(int(d["iA"].size), nB),
                extra_flags=("weakly_tested",) if weak else ())


def _pool(ctx: _Ctx, members: list[str], need_here: list[str], *, min_fit: int, min_pool: int,
          min_test_units: int, pool_alpha: float, own: bool = False) -> None:
    """Pooled thresholds (or refusals) for the small groups ``need_here`` of one pool."""
    a, g, nmin = ctx.a, ctx.g, ctx.nmin
    if len(members) < min_pool:
        for s in need_here:
            ctx.refuse(s, f"{ctx.info[s]['iB'].size} calibration units < {nmin} needed for budget {a:g} at "
                       f"confidence {g:g}, and its pool has {len(members)} group(s) < min_pool = {min_pool}",
                       ctx.need(ctx.info[s]))
        return
    if own:
        _pool_own(ctx, members, need_here, min_pool=min_pool, min_test_units=min_test_units, pool_alpha=pool_alpha)
        return
    names_union = tuple(n_ for n_ in ctx.names if any(n_ in ctx.info[gn]["names"] for gn in members))
    cols = [ctx.names.index(n_) for n_ in names_union]
    kfit = _pool_fit_sizes([ctx.info[gn]["units"].n for gn in members], len(cols), min_fit, nmin)
    qP, scores, ncal = _pool_scores(ctx, members, cols, names_union, kfit)
    adj, ok = _pool_members(scores, members, _pool_p, min_test_units, pool_alpha)
    pooled = np.concatenate([scores[gn] for gn in ok]) if ok else np.empty(0)
    for s in need_here:
        if _pool_refusal(ctx, s, adj, pooled, ok, min_pool, min_test_units, pool_alpha):
            continue
        d = ctx.info[s]
        r = ctx.rank_of(pooled.size)
        thr = float(np.sort(pooled)[r - 1])
        act_names = tuple(n_ for n_ in names_union if n_ in d["names"])
        qg = np.array([qP[names_union.index(n_)] for n_ in act_names])
        guar = (_guarantee_pac(a, g, pooled.size, r, clusters=ctx.clusters_declared)
                + f" Holds for this group only if its scores are exchangeable with the pooled scores of "
                f"{len(ok)} groups: tested (Anderson-Darling and Mann-Whitney against the rest of the pool, Holm-adjusted "
                f"p = {adj[s]:.3g} > {pool_alpha:g}), not proved.")
        reason = (f"pooled order statistic: own {d['iB'].size} calibration units < {nmin} needed; borrowed "
                  f"{pooled.size} scores of {len(ok)} exchangeable groups (normalisers shared by the pool)")
        _finish(ctx, s, thr, "pooled_order_statistic", guar, qg, act_names, r, pooled.size, reason,
                pool=tuple(ok), pool_p=float(adj[s]), split=(int(kfit[members.index(s)]), ncal[s]))


def _pool_refusal(ctx: _Ctx, s: str, adj: dict[str, float], pooled: np.ndarray, ok: list[str], min_pool: int,
                  min_test_units: int, pool_alpha: float, need_n: int | None = None) -> bool:
    """Refuse ``s`` (and return True) when it cannot borrow from its pool (``need_n``: the
    pooled scores its bound needs, default the order statistic's minimum)."""
    d, a, g, nmin = ctx.info[s], ctx.a, ctx.g, ctx.nmin
    if s not in adj:
        ctx.refuse(s, f"{d['iB'].size} calibration units: fewer than {nmin} for its own threshold and "
                   f"fewer than min_test_units = {min_test_units} {'positive ' if need_n else ''}scores to test "
                   "exchangeability with a pool" + (" (too few for the tail test to be able to refuse it)"
                                                    if need_n else ""), ctx.need(d))
        return True
    if adj[s] <= pool_alpha:
        ctx.refuse(s, f"{d['iB'].size} calibration units < {nmin} needed for budget {a:g} at confidence "
                   f"{g:g}, and its scores "
                   + ("have a heavier upper tail than the pool's (one-sided tail-count" if need_n
                      else "are not exchangeable with the pool (Anderson-Darling and Mann-Whitney")
                   + f" tests, Holm-adjusted p = {adj[s]:.3g} <= {pool_alpha:g})", ctx.need(d))
        return True
    nmin = nmin if need_n is None else need_n
    if pooled.size < nmin or len(ok) < min_pool:
        ctx.refuse(s, f"{d['iB'].size} calibration units < {nmin} needed; the exchangeable pool has "
                   f"{pooled.size} scores from {len(ok)} groups (need {nmin} scores, {min_pool} groups)", ctx.need(d))
        return True
    return False
