"""Independent units of a group and the combined score of the certified engine.

The first steps of :func:`tolstat.calibration.engine.certify`, on plain arrays: exact
duplicate runs and declared clusters collapsed into independent units (:func:`collapse`,
:class:`Units`), the deterministic seeded split of the units into a fitting part A and a
calibration part B (:func:`fit_size`, :func:`split_units`), the normalisers fitted on A
(:func:`fit_normalisers`) and the combined score ``S = max_j T_j / q_j`` (:func:`score`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from tolstat._base.util import factorize


__all__ = [
    "Units",
    "collapse",
    "fit_size",
    "split_units",
    "fit_normalisers",
]


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
    values : numpy.ndarray of float64, shape (n_units, n_statistics)
        Per-unit statistics, read as float64 whatever the statistics' dtype (a cluster's
        per-statistic maximum; NaN = not applicable).
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
             names: Sequence[str] | None = None, copy: bool = True) -> Units:
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
    copy : bool, default True
        False lets :attr:`Units.values` be ``stats`` itself (a float64 matrix) when no run
        is dropped or joined: no copy of a large matrix the caller no longer changes.

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
    if n_dup or (copy and lab is None):
        m = m[keep]
    if lab is None:
        return Units(m, keys, n, int(n_dup), None)
    if n_dup:
        lab = lab[keep]
    uniq, inv = factorize(lab)  # numpy.unique's arrays
    # per unit and statistic the largest member value; fmax skips NaN, so a unit none of
    # whose members has the statistic keeps NaN
    out = np.full((m.shape[1], uniq.size), np.nan)
    for j in range(m.shape[1]):
        np.fmax.at(out[j], inv, m[:, j])
    return Units(np.ascontiguousarray(out.T), keys, n, int(n_dup), int(uniq.size))


def unit_scores(values: np.ndarray, q: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """The combined score ``max_j T_j / q_j`` of each unit (NaN statistics skipped):
    ``numpy.nanmax(values[rows] / q, axis=1)``, in one numba pass without the two copies
    (:func:`tolstat.calibration.unit_kernels.scaled_row_max`).

    Parameters
    ----------
    values : ndarray, shape (units, statistics)
        The units' statistics.
    q : ndarray, shape (statistics,)
        The normalisers.
    rows : ndarray of int, optional
        The units to score (default all), in that order.
    """
    from tolstat.calibration.unit_kernels import scaled_row_max

    v = np.ascontiguousarray(values, dtype=np.float64)
    idx = np.arange(v.shape[0], dtype=np.intp) if rows is None else np.asarray(rows, dtype=np.intp)
    out = np.empty(idx.size, dtype=np.float64)
    scaled_row_max(v, idx, np.ascontiguousarray(q, dtype=np.float64).ravel(), out)
    return out


def statistic_layout(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Which statistics (columns) some unit has (not NaN), and how many units have none."""
    from tolstat.calibration.unit_kernels import nan_layout

    v = np.ascontiguousarray(values, dtype=np.float64)
    has = np.empty(v.shape[1], dtype=np.bool_)
    empty = nan_layout(v, has)
    return has, int(empty)


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
    rest = np.ones(n_units, dtype=bool)
    rest[perm[:n_fit]] = False
    return np.sort(perm[:n_fit]), np.flatnonzero(rest)  # B: the sorted complement, without a sort


def fit_normalisers(values: np.ndarray, *, quantile: float = 1.0, resolution: Any = None,
                    names: Sequence[str] | None = None) -> np.ndarray:
    """Normalisers ``q_j``: an upper quantile of each statistic over the fitting units.

    Parameters
    ----------
    values : ndarray, shape (units, statistics)
        Statistics of the fitting part (NaN ignored).
    quantile : float, default 1.0
        Quantile level (empirical, ``method="higher"``, so ``q_j`` is an observed value;
        the default is the largest, see :attr:`~tolstat.calibration.engine.CertifyOptions.norm_quantile`).
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
