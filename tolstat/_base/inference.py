"""Inference primitives, one home each: Clopper-Pearson bounds, Holm's adjustment, the budget verdict.

Every module that bounds a binomial proportion (a false-positive rate, a share of
inexact runs) or adjusts p-values for multiplicity calls these, at the confidence it
states:

* :func:`clopper_pearson` — the exact (Clopper-Pearson) interval; the closed form with
  beta quantiles, vectorised, equal to ``scipy.stats.binomtest(k, n).proportion_ci(level,
  method="exact")`` (tested), without its per-call root finding;
* :func:`clopper_pearson_upper` — the one-sided exact upper bound at ``level``;
* :func:`holm` — Holm's step-down adjusted p-values (``statsmodels``
  ``multipletests(method="holm")``: a well-kept implementation beats a hand-written one);
* :func:`budget_verdict` — whether an interval of a false-positive rate shows a budget
  held, broken, or is consistent with it;
* :func:`split_budget` — the per-check budget of a suite of checks (Bonferroni, or Šidák
  where the caller states independence).

Layer: foundation (numpy, scipy and statsmodels only).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tolstat._base.validate import budget as _budget

__all__ = ["clopper_pearson", "clopper_pearson_upper", "holm", "budget_verdict", "split_budget"]


def clopper_pearson(k: Any, n: Any, level: float) -> tuple[Any, Any]:
    """Two-sided exact interval of ``k`` successes in ``n`` trials at ``level`` (NaN where ``n == 0``)."""
    from scipy import stats

    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    a = (1.0 - float(level)) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(a, k, n - k + 1), 0.0)
        hi = np.where(k < n, stats.beta.ppf(1.0 - a, k + 1, n - k), 1.0)
    lo = np.where(n > 0, lo, np.nan)
    hi = np.where(n > 0, hi, np.nan)
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def clopper_pearson_upper(k: int, n: int, level: float) -> float:
    """One-sided exact upper confidence bound of a proportion at ``level`` (NaN for ``n == 0``)."""
    from scipy import stats

    k, n = int(k), int(n)
    if n == 0:
        return math.nan
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(float(level), k + 1, n - k))


def holm(p: Any) -> np.ndarray:
    """Holm step-down adjusted p-values (statsmodels ``multipletests(method="holm")``); NaN stays NaN."""
    p = np.asarray(p, dtype=np.float64).ravel()
    out = np.full(p.size, math.nan)
    ok = ~np.isnan(p)
    if ok.any():
        from statsmodels.stats.multitest import multipletests

        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def budget_verdict(lo: float, hi: float, budget: float) -> str:
    """``"held"`` (the interval lies at or below the budget), ``"broken"`` (above it),
    ``"consistent"`` (it contains the budget) or ``"no data"``."""
    if math.isnan(hi):
        return "no data"
    if hi <= budget:
        return "held"
    if lo > budget:
        return "broken"
    return "consistent"


def split_budget(suite_budget: float, n_checks: int, *, method: str = "bonferroni",
                 independent: bool = False) -> float:
    """Per-check false-positive budget so that a suite of ``n_checks`` keeps ``suite_budget``.

    Parameters
    ----------
    suite_budget : float
        Acceptable probability that *any* of the checks of a correct suite fails.
    n_checks : int
        Number of checks in the suite.
    method : {"bonferroni", "sidak"}
        ``"bonferroni"`` (default): ``a / N``, the union bound, valid under any
        dependence. ``"sidak"``: ``1 - (1 - a)**(1/N)``, *not* a union bound: exact for
        independent checks, so it is allowed only with ``independent=True``.
    independent : bool, default False
        The caller states that the checks are independent (required by ``"sidak"``).

    Returns
    -------
    float

    Examples
    --------
    >>> split_budget(0.01, 100, method="bonferroni")
    0.0001
    >>> round(split_budget(0.01, 100, method="sidak", independent=True), 8)
    0.0001005
    """
    a = _budget("suite_budget", suite_budget)
    if int(n_checks) != n_checks or n_checks < 1:
        raise ValueError(f"n_checks must be a positive integer, got {n_checks!r}")
    n = int(n_checks)
    if method == "bonferroni":
        return a / n
    if method == "sidak":
        if not independent:
            raise ValueError("method='sidak' is not a union bound: it holds only for independent checks; pass "
                             "independent=True to state that, or use method='bonferroni'")
        return -math.expm1(math.log1p(-a) / n)
    raise ValueError(f"method must be 'bonferroni' or 'sidak', got {method!r}")
