"""The decision of a check, defined once: the number compared with each threshold.

A table entry holds, per statistic, a threshold; a check of one output fails when one
statistic's *decision value* exceeds its threshold. The decision value is computed here,
and only here, for every consumer:

* calibration (:func:`tolstat.select`, every form) certifies thresholds on
  :func:`run_values` of the calibration runs;
* :func:`tolstat.check` / :func:`tolstat.assert_close` and the pytest plugin compare
  :func:`pair_value` of one output (the operator form:
  :func:`tolstat.models.statistics.pair_op_statistics`, which applies the same rule);
* :func:`check_runs`, :func:`tolstat.compare` and :func:`tolstat.assess.evaluation` compare
  :func:`run_values` of held-out runs.

The decision value of a statistic is the registered statistic
(:mod:`tolstat.models.statistics`) with one rule on top: **a correctly rounded output** (every
element the reference rounded to nearest in the output format,
:func:`tolstat.models.statistics.correctly_rounded`) **has decision value 0**, so it passes every
threshold. The rule is a property of the whole run, so it is computed exactly from an
error dataset (``max_ulp``) and from a pair (``max(ulp)``) alike:
``tests/test_decision.py`` checks that ``check`` compares, for every calibration run, the
very number the calibration certified. Against a table entry, an output with more
elements than every calibration run of its group has its decision carried to its size
(:func:`beyond_calibrated_size`, model-based; the operator form's own rule is
:func:`tolstat.measure.noise.beyond_calibration`), by the check and by
:func:`entry_run_values` alike.

Layer: selection (first module; imports only the dataset layer).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from tolstat.measure.metrics import ErrorMetrics
from tolstat.models.statistics import correctly_rounded
from tolstat.models.statistics import get as get_statistic

__all__ = ["run_values", "pair_value", "exceeds", "ratio", "ratio_value", "pair_is_correctly_rounded", "entry_run_values",
           "entry_failed_runs", "size_factors", "carried_values", "beyond_calibrated_size", "SQRT_N_STATISTICS",
           "is_max_statistic"]


def _run_correctly_rounded(ds: Any, rows: np.ndarray | None = None) -> np.ndarray:
    ulp, nonfinite = np.asarray(ds["max_ulp"].values, dtype=np.float64), np.asarray(ds["n_nonfinite"].values)
    if rows is not None:
        ulp, nonfinite = ulp[rows], nonfinite[rows]
    return correctly_rounded(ulp) & (nonfinite == 0)


def run_values(ds: Any, name: str, model: Any = None, rows: Any = None) -> np.ndarray:
    """Decision value of statistic ``name`` for every run of an error dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        Error dataset (calibration or held-out runs).
    name : str
        A registered statistic (``max_abs``, ``max_rel``, ``max_ulp``, ``max_score``,
        ``bias``, ``op_score``).
    model : ScaleModel or mapping, optional
        The scale model of ``max_score``; the certificate (with ``normalisers``) of
        ``op_score``.
    rows : array_like of int, optional
        Positions along ``run`` of the runs to score (default: every run). The values
        equal ``run_values(ds.isel(run=rows), ...)``; a statistic that reads its runs
        by position (``max_score``) does so without cutting the dataset out.

    Returns
    -------
    numpy.ndarray of float64
        One value per run: the statistic, 0 for a correctly rounded run, ``inf`` for a
        run with non-finite output.
    """
    if rows is not None:
        rows = np.asarray(rows, dtype=np.intp)
    x = np.array(get_statistic(name).run_scores(ds, model, rows).scores, dtype=np.float64)
    return np.where(_run_correctly_rounded(ds, rows), 0.0, x)


def pair_is_correctly_rounded(m: ErrorMetrics) -> bool:
    """True when every element of the pair is the reference rounded to nearest."""
    return bool(m.ulp.size) and m.n_nonfinite == 0 and bool(correctly_rounded(np.max(m.ulp)))


def pair_value(m: ErrorMetrics, name: str, model: Any = None, covariates: Mapping[str, Any] | None = None,
               dtype: str | None = None) -> float:
    """Decision value of statistic ``name`` for one output/reference pair (see :func:`run_values`)."""
    if pair_is_correctly_rounded(m):
        return 0.0
    return float(get_statistic(name).value(m, model, covariates, dtype))


#: the statistics of the scale forms and ``form=None`` that, for a correct kernel whose
#: rounding is slightly biased, grow like ``sqrt(n)`` (``sqrt(N) |mean d| / mean |d|``):
#: :func:`beyond_calibrated_size` reads them at the calibrated size
SQRT_N_STATISTICS = frozenset({"bias"})


def size_factors(entry: Any, n: Any) -> tuple[Any, Any] | None:
    """What a decision of an output (or of runs) of ``n`` elements divides by, beyond the
    calibrated size of a scale-form or ``form=None`` entry: ``(f, g)`` with ``f`` the
    factor of the maxima over elements (:func:`tolstat.measure.noise.maxima_extrapolation`
    of ``n`` over the certificate's ``n_elements_max``: model-based, independent normal
    element errors) and ``g = sqrt(n / n_elements_max)`` that of :data:`SQRT_N_STATISTICS`
    (:func:`tolstat.measure.noise.bias_extrapolation`); 1 where ``n <= n_elements_max``.
    None where nothing is carried: every ``n`` within the calibrated size, an
    operator-form entry (its statistics are carried by
    :func:`tolstat.measure.noise.beyond_calibration`), or a table that does not record
    ``n_elements_max``. ``n`` may be an array (one per run)."""
    if getattr(entry, "operator", False):
        return None
    n_max = (entry.certificate or {}).get("n_elements_max")
    if n_max is None or not float(n_max) >= 1:
        return None
    if isinstance(n, (int, float, np.integer, np.floating)):
        if not float(n) > float(n_max):  # one check within the calibrated size: its common case
            return None
    elif not np.any(np.asarray(n, dtype=np.float64) > float(n_max)):
        return None
    from tolstat.measure.noise import bias_extrapolation, maxima_extrapolation

    return (maxima_extrapolation(n, float(n_max), name="n_elements_max"), bias_extrapolation(n, float(n_max)))


def carried_values(values: Mapping[str, Any], factors: tuple[Any, Any] | None) -> dict[str, Any]:
    """``values`` divided by :func:`size_factors`' ``factors``: the statistics of kind
    ``max`` by ``f``, :data:`SQRT_N_STATISTICS` by ``g``, the others as they are (``None``:
    every value as it is)."""
    if factors is None:
        return dict(values)
    f, g = factors
    out = {}
    for k, v in values.items():
        if k in SQRT_N_STATISTICS:
            out[k] = v / g
        else:
            out[k] = v / f if is_max_statistic(k) else v
    return out


def beyond_calibrated_size(values: Mapping[str, Any], entry: Any, n: Any) -> dict[str, Any]:
    """The decision values of a scale-form or ``form=None`` entry for outputs of ``n``
    elements, beyond its calibrated size as every decision reads them (``check``, both of
    its paths, and the scoring of recorded runs, :func:`entry_run_values`).

    A statistic that is the largest over the output's elements (``max_score``,
    ``max_abs``, ``max_rel``, ``max_ulp``: kind ``max``) is larger over more elements:
    beyond ``n_elements_max`` it is divided by :func:`size_factors`' ``f``, which carries
    the largest of ``n_elements_max`` normal element errors to the largest of ``n``
    (model-based). The bias (:data:`SQRT_N_STATISTICS`) is read at the calibrated size
    (divided by ``g``). Other statistics, outputs within the calibrated size and
    operator-form entries: as they are (0 stays 0: a correctly rounded output passes).
    """
    return carried_values(values, size_factors(entry, n))


def is_max_statistic(name: str) -> bool:
    """True for a registered statistic that is the largest over an output's elements (kind ``max``)."""
    try:
        return get_statistic(name).kind == "max"
    except ValueError:
        return False


def _entry_model(entry: Any, name: str) -> Any:
    return entry.certificate if get_statistic(name).kind == "score" else entry.scale


def entry_run_values(ds: Any, entry: Any) -> dict[str, np.ndarray]:
    """Decision values of every statistic of a table entry over the runs of ``ds``; runs
    with more elements than the entry's calibration runs as :func:`beyond_calibrated_size`
    reads them (operator-form entries: :func:`tolstat.measure.noise.beyond_calibration`,
    in their score)."""
    vals = {name: run_values(ds, name, _entry_model(entry, name)) for name in entry.statistics}
    if not getattr(entry, "operator", False) and "n_elements" in ds:
        vals = beyond_calibrated_size(vals, entry, np.asarray(ds["n_elements"].values))
    return vals


def entry_failed_runs(ds: Any, entry: Any) -> np.ndarray:
    """True for each run of ``ds`` that fails the entry (some decision value over its threshold).

    A refused statistic (NaN threshold) raises: such a group cannot be checked.
    """
    fail = np.zeros(ds.sizes["run"], dtype=bool)
    for name, vals in entry_run_values(ds, entry).items():
        thr = float(entry.statistics[name].threshold)
        if math.isnan(thr):
            raise ValueError(f"table group ({entry.op}, {entry.dtype}, {entry.hardware}): statistic {name!r} "
                             "was refused at calibration (no threshold); it cannot be checked")
        fail |= exceeds(vals, thr)
    return fail


def exceeds(value: Any, threshold: float) -> Any:
    """The comparison of a check: fails when the decision value is over the threshold.

    A NaN value (no statistic of the combined score applies to the run) does not fail;
    ``inf`` (non-finite output) always does.
    """
    if type(value) is float and type(threshold) is float:  # one check: the same comparison, no array
        return value > threshold
    return np.greater(value, threshold)


def ratio(x: Any, thr: float) -> np.ndarray:
    """``x / thr`` with ``0/0 = 0`` (a zero threshold passes only exact results), such that
    ``ratio > 1`` exactly when the check's comparison (:func:`exceeds`) fails: the ratio a
    check reports and :func:`tolstat.compare` scores."""
    x = np.asarray(x, dtype=np.float64)
    if thr == 0.0:
        return np.where(x > 0, np.inf, np.where(np.isnan(x), np.nan, 0.0))
    # thr != 0 here, so nothing divides by zero; a huge x over a tiny thr overflows to inf
    # (a failed check, ratio inf, as ratio_value gives), without a warning
    with np.errstate(invalid="ignore", over="ignore"):
        r = x / thr
    over = exceeds(x, thr)
    return np.where(over, np.maximum(r, np.nextafter(1.0, 2.0)), np.where(np.isnan(x), np.nan, np.minimum(r, 1.0)))


_ABOVE_ONE = float(np.nextafter(1.0, 2.0))


def ratio_value(x: float, thr: float) -> float:
    """:func:`ratio` of one value, as a float: the same number (``float(ratio(x, thr))``,
    tested on the edge cases), without the arrays (a check's per-call cost)."""
    x, thr = float(x), float(thr)
    if thr == 0.0:
        return math.inf if x > 0 else (math.nan if math.isnan(x) else 0.0)
    r = x / thr
    if x > thr:  # exceeds(x, thr); r is not NaN here
        return max(r, _ABOVE_ONE)
    if math.isnan(x):
        return math.nan
    return min(r, 1.0)  # NaN stays NaN (inf / inf, a NaN threshold), as numpy.minimum
