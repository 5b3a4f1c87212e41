"""Distribution-free upper bounds from order statistics (binomial rule, split conformal).

Both bounds are an order statistic ``X_(r)`` (the r-th smallest) of each group, found by
selection (:func:`tolstat.models.estimators.quantiles.kth_smallest_groups`). Only the rank
depends on the method:

* **order statistic** (Wilks): the smallest ``r`` with ``binom.cdf(r - 1, n, p) >= gamma``,
  so that ``P(X_(r) >= q_p) >= gamma`` for any continuous distribution (and
  conservatively for discrete ones, e.g. ULP lattices with ties). The maximum
  (``r = n``) has confidence ``1 - p**n``, so a bound exists only for
  ``n >= ln(1 - gamma) / ln(p)``.
* **split conformal**: ``r = ceil((n + 1)(1 - alpha))``, so that a new exchangeable
  observation is ``<= X_(r)`` with probability ``>= 1 - alpha``; it needs
  ``n >= (1 - alpha) / alpha``.

When a group is too small a ``ValueError`` names the minimum n.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from tolstat._base.validate import unit_interval as _unit
from tolstat.models.estimators.quantiles import kth_smallest_groups

__all__ = [
    "order_statistic_rank",
    "order_statistic_min_n",
    "order_statistic_bound",
    "conformal_rank",
    "conformal_min_n",
    "conformal_bound",
]




def order_statistic_min_n(p: float, confidence: float) -> int:
    """Smallest n for which the sample maximum bounds the p-quantile with ``confidence``.

    ``n >= ln(1 - confidence) / ln(p)`` (59 for 0.95/0.95, 299 for p = 0.99).
    """
    p = _unit("p", p)
    g = _unit("confidence", confidence)
    n = max(1, math.ceil(math.log1p(-g) / math.log(p) - 1e-9))
    while 1.0 - p**n < g:
        n += 1
    while n > 1 and 1.0 - p ** (n - 1) >= g:
        n -= 1
    return n


def order_statistic_rank(n, p: float, confidence: float) -> np.ndarray:
    """1-based rank r of the distribution-free upper confidence bound of the p-quantile.

    Parameters
    ----------
    n : int or array_like of int
        Sample size(s).
    p : float
        Quantile level in (0, 1).
    confidence : float
        Confidence gamma in (0, 1).

    Returns
    -------
    ndarray of int64
        The smallest ``r`` with ``binom.cdf(r - 1, n, p) >= confidence``.

    Raises
    ------
    ValueError
        If some ``n`` is below :func:`order_statistic_min_n` (no order statistic
        qualifies); the message names the minimum n.
    """
    p = _unit("p", p)
    g = _unit("confidence", confidence)
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    nmin = order_statistic_min_n(p, g)
    if np.any(n < nmin):
        raise ValueError(
            f"n = {int(n.min())} is too small for an upper bound of the {p}-quantile "
            f"with confidence {g}: need n >= {nmin} (n >= ln(1-gamma)/ln(p))"
        )
    k = stats.binom.ppf(g, n, p).astype(np.int64)  # smallest k with cdf(k) >= g
    # guard the ppf against rounding: enforce cdf(k) >= g > cdf(k - 1) exactly as defined
    for _ in range(3):
        low = stats.binom.cdf(k, n, p) < g
        k = np.where(low, k + 1, k)
        high = (k > 0) & (stats.binom.cdf(k - 1, n, p) >= g)
        k = np.where(high, k - 1, k)
    r = k + 1
    return np.minimum(r, n)


def order_statistic_bound(x, p: float, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distribution-free upper confidence bound of the p-quantile, per group.

    Parameters
    ----------
    x : array_like, shape (groups, obs) or (obs,)
        NaN-padded samples (NaN = missing).
    p, confidence : float
        Quantile level and confidence.

    Returns
    -------
    bound, rank, n : ndarray
        ``bound[i] = X_(rank[i])`` of group i, the rank used and the group size.

    Raises
    ------
    ValueError
        Empty group or a group smaller than the minimum n (named in the message).
    """
    a = np.asarray(x, dtype=np.float64)
    a2 = a[None, :] if a.ndim == 1 else a
    n = np.sum(~np.isnan(a2), axis=1)
    if np.any(n == 0):
        raise ValueError(f"group {int(np.flatnonzero(n == 0)[0])} is empty (or all NaN)")
    r = order_statistic_rank(n, p, confidence)
    val, _ = kth_smallest_groups(a2, r)
    return val, r, n


def conformal_min_n(alpha: float) -> int:
    """Smallest n with ``ceil((n + 1)(1 - alpha)) <= n`` (99 for alpha = 0.01)."""
    a = _unit("alpha", alpha)
    n = max(1, math.floor((1 - a) / a) - 1)
    while conformal_rank_unchecked(n, a) > n:
        n += 1
    return n


def conformal_rank_unchecked(n, alpha: float):
    """``ceil((n + 1)(1 - alpha))`` with a 1e-9 guard against representation error."""
    n = np.asarray(n, dtype=np.int64)
    return np.ceil((n + 1) * (1.0 - alpha) - 1e-9).astype(np.int64)


def conformal_rank(n, alpha: float) -> np.ndarray:
    """Rank ``ceil((n + 1)(1 - alpha))`` of the split-conformal bound; error if it exceeds n."""
    a = _unit("alpha", alpha)
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    r = conformal_rank_unchecked(n, a)
    if np.any(r > n):
        raise ValueError(
            f"n = {int(n[r > n].min())} calibration scores are too few for alpha = {a}: "
            f"need n >= {conformal_min_n(a)} (ceil((n+1)(1-alpha)) <= n)"
        )
    return r


def conformal_bound(x, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split-conformal upper bound per group: the ``ceil((n+1)(1-alpha))``-th smallest.

    Returns ``(bound, rank, n)``; raises ``ValueError`` for empty or too-small groups.
    """
    a = np.asarray(x, dtype=np.float64)
    a2 = a[None, :] if a.ndim == 1 else a
    n = np.sum(~np.isnan(a2), axis=1)
    if np.any(n == 0):
        raise ValueError(f"group {int(np.flatnonzero(n == 0)[0])} is empty (or all NaN)")
    r = conformal_rank(n, alpha)
    val, _ = kth_smallest_groups(a2, r)
    return val, r, n
