"""Tiny per-check budgets from few calibration runs: a model-based tail on top of the order statistic.

A suite of ``N`` checks at a suite budget ``A`` gives each check ``A / N`` (the union
bound). A Hypothesis test of 100 examples at ``A = 1%`` needs ``1e-4`` per check, and the
distribution-free order statistic at ``1e-4`` and 95% confidence needs about 30,000
calibration units (``log(1 - confidence) / log(1 - budget)``).
:func:`~tolstat.calibration.selection.rebudget` refuses such a group.
:func:`extend_budget` extends it instead, with a stated model:

1. **Anchor** (distribution-free). With ``n`` calibration units, the largest score
   ``T_0`` is an upper confidence bound, at the group's confidence ``g``, of the score's
   quantile at the budget ``a_0 = 1 - (1 - g)^(1/n)``: ``P(T_0 < q(a_0)) = (1 - a_0)^n =
   1 - g``. ``a_0`` is the smallest budget the runs support (``6.2e-3`` for 480 units).
2. **Tail** (model-based). Below ``a_0`` the score's quantiles are assumed to grow no
   faster than those of a centred normal distribution:
   ``q(b) <= q(a_0) z(b) / z(a_0)`` for ``b < a_0``, with ``z(d) = Phi^{-1}(1 - d)`` the
   standard normal quantile. This is the tail of the probabilistic rounding-error model
   of :mod:`tolstat.ops` (a sum of independent, mean-zero, bounded rounding errors is
   sub-Gaussian: its tail factor grows like ``sqrt(log(1 / delta))``). The ratio is that
   of one normal variable; the quantile ratio of the largest of ``n`` of them (a maximum
   over elements), of ``|N|``, or of a normal variable with a positive mean is smaller,
   so one ratio serves the statistics of the score (maxima; RMS and bias, averages, are
   close to normal). The ratio of the Chernoff factors ``sqrt(2 log(2 / d))`` that
   :func:`tolstat.ops.tolerance` uses is *not* used: it is smaller than the normal
   quantiles' ratio and would under-cover a score that is exactly normal.
3. **Threshold**: ``max(T_0 z(b) / z(a_0), T_table)``, never below the table's own
   threshold (which holds the resolution floor: a correctly rounded output passes).

The promise is therefore: with probability at least ``g`` over the calibration units, *and
if the assumption of step 2 holds*, a correct run fails the check with probability at
most ``b`` (for a score that is exactly normal the coverage is exactly ``g``:
``tests/test_suite_budget_hypothesis.py`` simulates it). It is not distribution-free and is labelled so (method ``"model_tail"``, the
reason and the certificate's ``guarantee``). The assumption breaks for a score whose tail
is heavier than Gaussian below ``a_0``: rare large-error runs (a mixture of kernels, a
data-dependent code path, inputs outside those calibrated) that the ``n`` runs did not
show. The reason of each extended threshold also reports a check the stored scores allow
(``tail check``): how the largest score compares with what the model predicts from the
``k``-th largest; a value above 1 means the stored scores already grow faster than the model.

Layer: calibration (imports only the calibration layer and below).
"""

from __future__ import annotations

import json
import math

import numpy as np

from tolstat._base import validate as _validate
from tolstat.calibration.selection import rebudget
from tolstat.calibration.table import ToleranceTable

__all__ = ["MODEL_TAIL", "MODEL_TAIL_LABEL", "TAIL_MODES", "gaussian_tail_ratio", "smallest_supported_budget",
           "extend_budget", "rebudget_with_tail"]

#: the method name of an extended threshold
MODEL_TAIL = "model_tail"
#: what every extended threshold says about its promise
MODEL_TAIL_LABEL = ("model-based: the largest calibration score (the order statistic at the smallest budget the "
                    "runs support), extended by the ratio of normal quantiles (assumes the score's quantiles below "
                    "that budget grow no faster than a normal distribution's, the sub-Gaussian tail of the "
                    "probabilistic rounding-error model of tolstat.ops); not distribution-free")
#: the tail modes of :func:`rebudget_with_tail`
TAIL_MODES = ("none", "model")
#: the rank of the score the tail check extrapolates from (the k-th largest)
_CHECK_RANK = 10


def gaussian_tail_ratio(budget: float, anchor: float) -> float:
    """``z(budget) / z(anchor)``, ``z(d) = Phi^{-1}(1 - d)`` the standard normal quantile: the model's growth.

    Parameters
    ----------
    budget : float
        The smaller budget, ``0 < budget <= anchor``.
    anchor : float
        The budget the threshold is known at, ``anchor < 1``.

    Returns
    -------
    float
        ``>= 1``; e.g. ``1.60`` from ``1e-2`` to ``1e-4``, ``2.04`` to ``1e-6``.

    Raises
    ------
    ValueError
        A budget outside ``(0, 1)`` or ``budget > anchor``.

    Examples
    --------
    >>> round(gaussian_tail_ratio(1e-4, 1e-2), 3)
    1.599
    """
    for name, v in (("budget", budget), ("anchor", anchor)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0.0 < v < 1.0:
            raise ValueError(f"{name} must be a probability in (0, 1), got {v!r}")
    if budget > anchor:
        raise ValueError(f"budget={budget!r} must be at most anchor={anchor!r} (the tail extends to smaller budgets)")
    if anchor >= 0.5:
        raise ValueError(f"anchor must be below 0.5 (a quantile above the normal's median), got {anchor!r}")
    from scipy.special import ndtri

    return float(ndtri(1.0 - float(budget)) / ndtri(1.0 - float(anchor)))


def smallest_supported_budget(n: int, confidence: float) -> float:
    """``1 - (1 - confidence)^(1/n)``: the budget whose quantile the largest of ``n`` scores bounds.

    Parameters
    ----------
    n : int
        Independent calibration units, ``>= 1`` (``>= 5`` at confidence 0.95 for a budget
        below 0.5).
    confidence : float
        In ``(0, 1)``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``n < 1`` or a confidence outside ``(0, 1)``.

    Examples
    --------
    >>> round(smallest_supported_budget(299, 0.95), 4)
    0.01
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (calibration units), got {n!r}")
    g = _validate.unit_interval("confidence", confidence)
    return float(-math.expm1(math.log1p(-g) / int(n)))


def _tail_check(top: np.ndarray, n: int) -> float:
    """Largest stored score over the model's prediction from the k-th largest (nan when not computable)."""
    k = min(_CHECK_RANK, top.size)
    if k < 2 or n < 4 * k or not top[k - 1] > 0:
        return math.nan
    pred = top[k - 1] * gaussian_tail_ratio(1.0 / n, k / n)
    return float(top[0] / pred)


def extend_budget(table: ToleranceTable, fp_budget: float, *, why: str = "") -> ToleranceTable:
    """The table re-budgeted to ``fp_budget``, with a model-based tail where the runs are too few.

    Every threshold the calibration runs support at the new budget is the distribution-free
    order statistic of :func:`~tolstat.calibration.selection.rebudget`, unchanged. A group
    whose runs are too few for it (and whose threshold is an order statistic of its own
    stored scores) gets ``max(T_0 z(b) / z(a_0), T_table)`` instead: ``T_0`` the
    largest calibration score, ``a_0 = 1 - (1 - g)^(1/n)`` the smallest budget ``n`` units
    support at confidence ``g`` (module docstring). Its method is ``"model_tail"``; its
    reason and the certificate's ``guarantee`` state the assumption. Groups ``rebudget``
    refuses for another reason (pooled, exact, conformal thresholds) stay refused.

    Parameters
    ----------
    table : ToleranceTable
    fp_budget : float
        The new per-check budget (at most the table's; ``>= 1e-9``).
    why : str
        Prefix of the new reasons (e.g. the suite budget it comes from).

    Returns
    -------
    ToleranceTable

    Raises
    ------
    ValueError
        A budget larger than the table's, or outside ``[1e-9, 0.5]``.
    """
    if not isinstance(table, ToleranceTable):
        raise TypeError(f"table must be a ToleranceTable, got {type(table).__name__}")
    a = _validate.budget("fp_budget", fp_budget)
    out = rebudget(table, a, why=why)
    src, ds = table.data, out.data
    factor = a / table.fp_budget
    thr, meth = ds["threshold"].values, ds["method"].values.astype(object)
    reason = ds["reason"].values.astype(object)
    certs = [str(c) for c in ds["certificate_json"].values] if "certificate_json" in ds else None
    pre = f"{why}: " if why else ""
    for i in range(ds.sizes["group"]):
        cj = str(src["certificate_json"].values[i]) if "certificate_json" in src else ""
        n = int(json.loads(cj).get("n_scores") or 0) if cj else int(src["n"].values[i])
        extended = []
        for j in range(ds.sizes["statistic"]):
            t_own = float(src["threshold"].values[i, j])
            top = src["top_scores"].values[i, j]
            top = np.sort(top[~np.isnan(top)])[::-1]
            if (math.isnan(t_own) or not math.isnan(thr[i, j]) or src["method"].values[i, j] != "order_statistic"
                    or top.size == 0 or n < top.size):
                continue  # re-budgeted distribution-free, or refused for a reason a tail cannot repair
            b = float(src["budget"].values[i, j]) * factor
            g = float(src["stat_confidence"].values[i, j])
            a0 = smallest_supported_budget(n, g)
            if b >= a0 or a0 >= 0.5:  # b >= a0 cannot happen when rebudget refused for too few runs
                continue
            ratio = gaussian_tail_ratio(b, a0)
            t0 = float(top[0])
            thr[i, j] = max(t0 * ratio, t_own)
            meth[i, j] = MODEL_TAIL
            chk = _tail_check(top, n)
            chk_txt = ("" if math.isnan(chk) else
                       f"; tail check: the largest score is {chk:.3g}x the model's prediction from the "
                       f"{min(_CHECK_RANK, top.size)}-th largest" + (" (heavier than the model: the extension "
                                                                      "may under-cover)" if chk > 1 else ""))
            reason[i, j] = (f"{pre}{MODEL_TAIL_LABEL}: the largest of {n} calibration scores {t0:.6g} bounds the "
                            f"quantile at budget {a0:.3g} (confidence {g:g}); times the normal quantile ratio "
                            f"{ratio:.4g} to budget {b:.3g} gives {t0 * ratio:.6g}; threshold "
                            f"{float(thr[i, j]):.6g} (at least the table's own {t_own:.6g}){chk_txt}")
            extended.append((b, g, a0))
        if extended and certs is not None and certs[i]:
            c = json.loads(certs[i])
            b, g, a0 = extended[0]
            c["guarantee"] = (f"{MODEL_TAIL_LABEL}. With probability >= {g:g} over the calibration units, and if "
                              f"the score's quantiles below budget {a0:.3g} grow no faster than a normal "
                              f"distribution's, the probability that the check of a new correct run fails is "
                              f"<= {b:.3g}.")
            certs[i] = json.dumps(c, sort_keys=True)
    ds["threshold"].values[...] = thr
    ds["method"] = (("group", "statistic"), meth.astype(str))
    ds["reason"] = (("group", "statistic"), reason.astype(str))
    if certs is not None:
        ds["certificate_json"] = (ds["certificate_json"].dims, np.array(certs, dtype=object).astype(str))
    prov = json.loads(ds.attrs.get("provenance", "{}"))
    prov["rebudget"]["tail"] = "model"
    ds.attrs["provenance"] = json.dumps(prov, sort_keys=True)
    return type(table)(ds)


def rebudget_with_tail(table: ToleranceTable, fp_budget: float, *, tail: str = "none",
                       why: str = "") -> ToleranceTable:
    """:func:`~tolstat.calibration.selection.rebudget` (``tail="none"``) or :func:`extend_budget` (``"model"``).

    Raises
    ------
    ValueError
        ``tail`` not one of :data:`TAIL_MODES`, or as the two functions.
    """
    if tail not in TAIL_MODES:
        raise ValueError(f"tail must be one of {TAIL_MODES}, got {tail!r}")
    if tail == "model":
        return extend_budget(table, fp_budget, why=why)
    return rebudget(table, fp_budget, why=why)
