"""Tolerances from zero runs: a model-based threshold from probabilistic rounding-error analysis.

A new kernel has no calibration runs. For one call of a known op, :func:`tolerance`
derives a per-element threshold from the operator model (:func:`~tolstat.ops.registry.op_statistics`:
the magnitude ``m_i``, the op on absolute inputs, and the reduction length ``K``) and the
unit roundoffs of the noise model (:func:`tolstat.measure.noise.noise_scale`)::

    T_i = u_out |ref_i| + lambda(fp_budget / n) (1 + u_out) sqrt(K) u_acc m_i
          + stores u_out m_i + u_out tiny_out

The accumulation term is the probabilistic bound of an inner product of length ``K``
(Higham and Mary, "A New Approach to Probabilistic Rounding Error Analysis"; Ipsen and
Zhou, "Probabilistic Error Analysis for Inner Products"): when the rounding errors are
independent, mean-zero and bounded by ``u_acc``, the accumulated error exceeds
``lambda(delta) sqrt(K) u_acc m_i`` with probability at most ``delta``, with
``lambda(delta) = sqrt(2 log(2 / delta))`` (the Azuma-Hoeffding tail of a martingale of
bounded increments). The final store to the output format adds at most half an ULP of
the stored value, ``u_out (|ref_i| + acc_i)``: the ``u_out |ref_i|`` term and the factor
``(1 + u_out)``; ``u_out tiny_out`` covers the subnormal range. ``stores`` (default 0)
counts intermediate roundings to the output format, each bounded by ``u_out m_i``. A
union bound over the output's ``n`` elements at ``delta = fp_budget / n`` makes a correct
run fail the whole check with probability at most ``fp_budget``; the union bound needs no independence
*between* elements (rows of a norm share their errors), only the model for each element.

The threshold is **model-based, never certified**: real kernels round intermediates to
the output format (split-K partials, attention probabilities), compute transcendental
functions with errors of several ``u``, or sum in orders that make the errors correlated.
Calibration runs replace it (:func:`tolstat.select` on collected runs);
:func:`fit_tolerance` uses the runs there are to fit the model's constant and extrapolate
it to tiny budgets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tolstat._base.dtypes import target_dtype, unit_roundoff
from tolstat.measure.noise import NoiseShape, noise_scale
from tolstat.ops._args import show
from tolstat.ops.registry import canonical_name, op_statistics

__all__ = ["MODEL_LABEL", "ZeroRunTolerance", "ZeroRunCheck", "FittedModel", "tail_factor", "tolerance",
           "check_zero_run", "fit_scale", "fit_tolerance"]

#: the label of every model-based threshold: what it assumes and that no run certified it
MODEL_LABEL = ("model-based: assumes independent, mean-zero rounding errors (probabilistic rounding-error "
               "analysis), not certified by calibration runs")


def tail_factor(delta: float) -> float:
    """``lambda(delta) = sqrt(2 log(2 / delta))``: the tail factor at per-element probability ``delta``.

    Parameters
    ----------
    delta : float
        Probability, ``0 < delta < 2`` (``lambda`` is 0 at 2).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``delta`` outside ``(0, 2)``.
    """
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(delta) < 2.0:
        raise ValueError(f"delta must be a probability in (0, 2), got {delta!r}")
    return math.sqrt(2.0 * math.log(2.0 / float(delta)))


def _budget(fp_budget: Any) -> float:
    if isinstance(fp_budget, bool) or not isinstance(fp_budget, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(fp_budget) < 1.0:
        raise ValueError(f"fp_budget must be a probability in (0, 1), got {fp_budget!r}")
    return float(fp_budget)


def _f64(x: Any, name: str) -> np.ndarray:
    from tolstat.measure.metrics import as_array

    a = as_array(x, name=name)
    if a.dtype.kind in "bOSUM":
        raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.float64)


@dataclass(frozen=True)
class ZeroRunTolerance:
    """A model-based per-element threshold ``|actual - expected| <= atol + rtol |expected|``.

    Attributes
    ----------
    op : str
        The op's canonical name.
    dtype, acc_dtype : str
        Output and accumulation formats (``u_out``, ``u_acc``).
    K : float
        Reduction length.
    n : int
        Output elements (the union bound's count).
    fp_budget : float
        Probability that a correct run fails the check, under the model.
    tail : float
        ``lambda(fp_budget / n)``.
    scale : float
        The model's constant ``c`` multiplying the tail (1 from zero runs, fitted by
        :func:`fit_tolerance`).
    magnitude : numpy.ndarray
        ``m_i``, the op on absolute inputs (:func:`~tolstat.ops.registry.op_statistics`).
    unit : numpy.ndarray
        ``(1 + u_out) sqrt(K) u_acc m_i``: the accumulation term at ``c lambda = 1``.
    atol : numpy.ndarray
        ``c lambda unit_i + stores u_out m_i + u_out tiny_out`` per element (the output's shape).
    rtol : float
        ``u_out``, the half ULP of a correctly rounded store.
    label : str
        ``MODEL_LABEL`` (and how the scale was found).
    stores : int
        Intermediate roundings to the output format the threshold allows, each
        ``u_out m_i`` (:func:`tolerance`).
    """

    op: str
    dtype: str
    acc_dtype: str
    K: float
    n: int
    fp_budget: float
    tail: float
    scale: float
    magnitude: np.ndarray
    unit: np.ndarray
    atol: np.ndarray
    rtol: float
    label: str = MODEL_LABEL
    stores: int = 0

    def threshold(self, expected: Any) -> np.ndarray:
        """``atol + rtol |expected|`` per element (float64, the output's shape): the noise
        model's scale (:func:`~tolstat.measure.noise.noise_scale`) with the accumulation weight
        ``c lambda (1 + u_out)``."""
        e = self._expected(expected)
        return noise_scale(e, dtype=self.dtype, magnitude=self.magnitude, K=self.K, acc_dtype=self.acc_dtype,
                           shape=NoiseShape(c_acc=self.scale * self.tail * (1.0 + self.rtol),
                                            c_mid=self.stores * math.sqrt(self.K)))

    def _expected(self, expected: Any) -> np.ndarray:
        e = _f64(expected, "expected")
        if e.shape != self.unit.shape:
            raise ValueError(f"expected has shape {e.shape} but the op's output (from inputs=) has shape "
                             f"{self.unit.shape}")
        return e

    def ratio(self, actual: Any, expected: Any) -> np.ndarray:
        """``|actual - expected| / threshold`` per element: > 1 fails.

        Matched non-finite pairs (equal infinities, NaN and NaN) give 0, any other
        non-finite difference ``inf``; a non-finite threshold (the op on absolute inputs
        overflowed) bounds nothing and gives 0 for a finite difference.
        """
        a = _f64(actual, "actual")
        e = self._expected(expected)
        if a.shape != e.shape:
            raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}")
        t = self.threshold(e)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            d = np.abs(a - e)
            r = d / t
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        r = np.where(np.isfinite(t), r, 0.0)
        r = np.where(np.isfinite(d), r, np.where(same, 0.0, np.inf))
        return np.where(np.isnan(r), np.inf, r)

    def failed(self, actual: Any, expected: Any) -> bool:
        """Whether a run fails the threshold (some element's ratio > 1)."""
        r = self.ratio(actual, expected)
        return bool(r.size and r.max() > 1.0)

    def passes(self, actual: Any, expected: Any) -> bool:
        """Whether a run passes (every element within its threshold)."""
        return not self.failed(actual, expected)

    def excess(self, actual: Any, expected: Any) -> float:
        """The run's largest error beyond the output rounding, in units of the accumulation term.

        ``max_i (|d_i| - u_out (|ref_i| + stores m_i + tiny_out))^+ / unit_i``: the smallest ``c
        lambda`` at which the run passes (what :func:`fit_scale` fits); ``inf`` where an
        element has an excess but the model no accumulation term (``m_i = 0``) or a
        non-finite error (unmatched), 0 for an empty output; an element with a non-finite
        magnitude bounds nothing and counts 0, as in :meth:`ratio`.
        """
        a = _f64(actual, "actual")
        e = self._expected(expected)
        if a.shape != e.shape:
            raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}")
        # u_out (|ref| + stores m + tiny): the deterministic terms
        base = noise_scale(e, dtype=self.dtype, magnitude=self.magnitude, K=self.K,
                           shape=NoiseShape(c_acc=0.0, c_mid=self.stores * math.sqrt(self.K)))
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            d = np.abs(a - e)
            x = np.maximum(d - base, 0.0)
            r = np.where(x > 0, x / self.unit, 0.0)
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        r = np.where(np.isfinite(self.unit), r, 0.0)  # a non-finite magnitude bounds nothing
        r = np.where(np.isfinite(d) | same, r, np.inf)
        return float(r.max()) if r.size else 0.0


def _dtype(dtype: Any, name: str = "dtype") -> str:
    try:
        return target_dtype(dtype).name
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a floating-point format, got {show(dtype)}") from exc


def _acc_name(dtype: str, acc_dtype: Any) -> str:
    """The accumulation format: given, or float32 (float64 for float64 outputs)."""
    if acc_dtype is None:
        return "float64" if target_dtype(dtype).bits > 32 else "float32"
    return _dtype(acc_dtype, "acc_dtype")


def _statistics(op: str, dtype: str, inputs: Sequence[Any],
                params: Mapping[str, Any] | None) -> tuple[str, np.ndarray, float]:
    if not isinstance(op, str):
        raise TypeError(f"op must be the name of a torch function (a str), got {show(op)}")
    st = op_statistics(op, inputs, params, dtype=dtype)
    return canonical_name(op) or op, st.magnitude, st.K


def _stores(stores: Any) -> int:
    if isinstance(stores, bool) or not isinstance(stores, (int, np.integer)) or stores < 0:
        raise ValueError(f"stores must be an int >= 0 (intermediate roundings to the output format), got {stores!r}")
    return int(stores)


def _make(op: str, dtype: str, acc: str, stats: tuple[np.ndarray, float, int], fp_budget: float, scale: float,
          label: str) -> ZeroRunTolerance:
    m, K, stores = stats
    n = max(int(m.size), 1)
    tail = tail_factor(fp_budget / n)
    td = target_dtype(dtype)
    u_out = unit_roundoff(td.name)
    with np.errstate(invalid="ignore", over="ignore"):
        # noise_scale's accumulation term u_acc sqrt(K) m, with the store's (1 + u_out)
        unit = ((1.0 + u_out) * unit_roundoff(acc) * math.sqrt(K)) * np.abs(m)
        atol = (scale * tail) * unit + (stores * u_out) * np.abs(m) + u_out * td.tiny
    return ZeroRunTolerance(op=op, dtype=td.name, acc_dtype=acc, K=K, n=int(m.size), fp_budget=fp_budget,
                            tail=tail, scale=scale, magnitude=m, unit=unit, atol=atol, rtol=u_out, label=label,
                            stores=stores)


def tolerance(op: str, dtype: Any, inputs: Sequence[Any], params: Mapping[str, Any] | None = None, *,
              fp_budget: float = 0.01, acc_dtype: Any = None, stores: int = 0) -> ZeroRunTolerance:
    """The model-based threshold of one call of ``op``, from zero runs.

    Parameters
    ----------
    op : str
        The torch function's name or an alias (``"matmul"``, ``"F.layer_norm"``).
    dtype : str or dtype
        The kernel's output format (``"float16"``, ``torch.bfloat16``).
    inputs : sequence
        The op's positional arguments, as the kernel was called (see
        :func:`~tolstat.ops.registry.op_statistics`).
    params : mapping, optional
        Its keyword arguments.
    fp_budget : float, default 0.01
        Probability, under the model, that a correct run fails the check (``0 < b < 1``).
    acc_dtype : str or dtype, optional
        The accumulation format; default float32 (float64 for float64 outputs), as the
        noise model.
    stores : int, default 0
        Intermediate roundings to the output format that the kernel makes on the way (a
        split-K partial or an unfused bias stored in fp16, softmax probabilities cast for
        the second product, a normalised value cast before its weight): each adds
        ``u_out m_i`` to the threshold, the deterministic bound of rounding a value, or
        each term of a sum, bounded by the op on absolute inputs. 0 assumes one rounding,
        the final store.

    Returns
    -------
    ZeroRunTolerance
        ``atol`` (per element), ``rtol`` (``u_out``) and :meth:`~ZeroRunTolerance.passes`;
        its ``label`` is ``MODEL_LABEL``: model-based, not certified.

    Raises
    ------
    ValueError
        A bad ``fp_budget``, ``dtype``, ``acc_dtype`` or ``stores`` (the message names it and the value).
    UnknownOpError, TypeError
        As :func:`~tolstat.ops.registry.op_statistics`.

    Examples
    --------
    >>> import numpy as np
    >>> from tolstat.ops import tolerance
    >>> a = np.ones((4, 64), np.float16); b = np.ones((64, 8), np.float16)
    >>> tol = tolerance("matmul", "float16", (a, b))
    >>> tol.passes(np.float16(64.0) * np.ones((4, 8), np.float16), a.astype(float) @ b)
    True
    """
    fp_budget = _budget(fp_budget)
    stores = _stores(stores)
    dt = _dtype(dtype)
    acc = _acc_name(dt, acc_dtype)
    name, m, K = _statistics(op, dt, inputs, params)
    return _make(name, dt, acc, (m, K, stores), fp_budget, 1.0, MODEL_LABEL)


@dataclass(frozen=True)
class ZeroRunCheck:
    """The verdict of :func:`check_zero_run`.

    Attributes
    ----------
    passed : bool
        Every element within its threshold.
    worst_ratio : float
        The largest ``|actual - expected| / threshold`` (> 1 fails).
    worst_index : tuple of int
        Where it is (``()`` for an empty or 0-d output).
    tolerance : ZeroRunTolerance
        The threshold that decided.
    label : str
        The threshold's label (model-based).
    """

    passed: bool
    worst_ratio: float
    worst_index: tuple[int, ...]
    tolerance: ZeroRunTolerance
    label: str

    def __bool__(self) -> bool:
        return self.passed


def check_zero_run(actual: Any, expected: Any, *, op: str, dtype: Any, inputs: Sequence[Any],
                   params: Mapping[str, Any] | None = None, fp_budget: float = 0.01,
                   acc_dtype: Any = None, stores: int = 0) -> ZeroRunCheck:
    """Decide one ``(actual, expected)`` pair against the zero-run threshold of :func:`tolerance`.

    Parameters
    ----------
    actual, expected : array_like
        Kernel output and float64 reference (the op's output shape).
    op, dtype, inputs, params, fp_budget, acc_dtype, stores
        As in :func:`tolerance`.

    Returns
    -------
    ZeroRunCheck
        ``passed``, ``worst_ratio`` and where, the tolerance and its model-based label.
    """
    tol = tolerance(op, dtype, inputs, params, fp_budget=fp_budget, acc_dtype=acc_dtype, stores=stores)
    r = tol.ratio(actual, expected)
    if r.size == 0:
        return ZeroRunCheck(True, 0.0, (), tol, tol.label)
    i = int(np.argmax(r))
    worst = float(r.flat[i])
    idx = tuple(int(j) for j in np.unravel_index(i, r.shape)) if r.ndim else ()
    return ZeroRunCheck(not worst > 1.0, worst, idx, tol, tol.label)


def fit_scale(excess: Sequence[float], sizes: Sequence[int]) -> float:
    """The model's constant ``c`` fitted on calibration runs: the smallest that their p-values allow.

    Under the model with constant ``c``, run ``r`` (largest excess ``E_r`` over ``n_r``
    elements, :meth:`ZeroRunTolerance.excess`) has the p-value
    ``p_r(c) = min(1, 2 n_r exp(-E_r^2 / (2 c^2)))``: it fails the threshold of budget
    ``b`` exactly when ``p_r(c) < b``, and ``P(p_r(c) < b) <= b``. The fit is the smallest
    ``c`` whose sorted p-values of the ``R`` runs lie at or above the plotting positions,
    ``p_(j) >= j / (R + 1)`` for every ``j``: at every budget ``j / (R + 1)`` the runs can
    resolve, the fitted threshold fails at most ``j - 1`` of them. Budgets below
    ``1 / (R + 1)`` are the model's Gaussian tail, extrapolated.

    Parameters
    ----------
    excess : sequence of float
        ``E_r >= 0`` per run.
    sizes : sequence of int
        ``n_r >= 1``, the output elements of each run.

    Returns
    -------
    float
        ``c >= 0`` (0 when no run has an error beyond its output rounding).

    Raises
    ------
    ValueError
        No runs, lengths differ, a negative or non-finite excess (an error the model cannot
        describe: an excess where it allows none) or a size below 1.
    """
    e = np.asarray(excess, dtype=np.float64).ravel()
    n = np.asarray(sizes, dtype=np.float64).ravel()
    if e.size == 0 or e.size != n.size:
        raise ValueError(f"excess and sizes must be non-empty and of one length, got {e.size} and {n.size}")
    bad = np.flatnonzero(~np.isfinite(e) | (e < 0))
    if bad.size:
        raise ValueError(f"excess of run {int(bad[0])} is {float(e[bad[0]])!r}: an error beyond the output rounding "
                         f"where the model allows none (or a non-finite one); the model does not describe "
                         f"this kernel, calibrate it with runs instead")
    if np.any(~np.isfinite(n) | (n < 1)):
        raise ValueError(f"sizes must be >= 1, got {n.tolist()}")
    R = e.size
    best = 0.0
    for j in range(1, R + 1):  # level j / (R + 1): c >= the j-th largest of E_r / lambda(level / n_r)
        alpha = j / (R + 1)
        c_r = e / np.sqrt(2.0 * np.log(2.0 * n / alpha))
        best = max(best, float(np.sort(c_r)[R - j]))
    return best


@dataclass(frozen=True)
class FittedModel:
    """The zero-run model with its constant fitted on calibration runs (:func:`fit_tolerance`).

    Attributes
    ----------
    op, dtype, acc_dtype : str
    scale : float
        The fitted ``c`` (:func:`fit_scale`).
    n_runs : int
        Runs it was fitted on.
    stores : int
        As in :func:`tolerance`.
    label : str
        ``MODEL_LABEL`` and the fit: model-based, tail extrapolated below ``1 / (n_runs + 1)``.
    """

    op: str
    dtype: str
    acc_dtype: str
    scale: float
    n_runs: int
    label: str
    stores: int = 0

    def tolerance(self, inputs: Sequence[Any], params: Mapping[str, Any] | None = None, *,
                  fp_budget: float = 0.01) -> ZeroRunTolerance:
        """The fitted threshold of one call at ``fp_budget`` per check (e.g. 1e-5)."""
        fp_budget = _budget(fp_budget)
        name, m, K = _statistics(self.op, self.dtype, inputs, params)
        return _make(name, self.dtype, self.acc_dtype, (m, K, self.stores), fp_budget, self.scale, self.label)


def _run_items(runs: Iterable[Any]) -> Iterable[tuple[Any, Any, Sequence[Any], Mapping[str, Any] | None]]:
    for i, r in enumerate(runs):
        if isinstance(r, Mapping):
            missing = [k for k in ("actual", "expected", "inputs") if k not in r]
            if missing:
                raise ValueError(f"run {i}: a mapping run needs the keys actual, expected, inputs; lacks {missing}")
            yield r["actual"], r["expected"], r["inputs"], r.get("params")
        elif isinstance(r, tuple) and len(r) in (3, 4):
            yield r[0], r[1], r[2], (r[3] if len(r) == 4 else None)
        else:
            raise TypeError(f"run {i}: expected (actual, expected, inputs[, params]) or a mapping, got {show(r)}")


def fit_tolerance(runs: Iterable[Any], *, op: str, dtype: Any, acc_dtype: Any = None,
                  stores: int = 0, floor: float = 1.0) -> FittedModel:
    """Fit the zero-run model's constant on a few correct runs, for tiny budgets per check.

    A distribution-free threshold at ``1e-5`` per check needs about ``3 / 1e-5`` runs; the
    model's threshold grows only like ``sqrt(log(n / budget))``. This fits its constant ``c``
    on the runs there are (:func:`fit_scale`) and extrapolates the model's tail to any
    budget: :meth:`FittedModel.tolerance`. Model-based, like the zero-run threshold.

    The constant is at least ``floor``, by default the theory's 1: the bound holds for any
    independent, mean-zero errors bounded by ``u_acc``, and a few runs cannot show that the
    tail is lighter (most accumulated errors hide under the output rounding, so the excess
    the runs show is a thinned sample of them). The runs can show that a kernel breaks the
    model (intermediates rounded to the output format, a long-tailed ``exp``): the fit
    then raises ``c`` above 1. ``floor=0`` gives the pure fit.

    Parameters
    ----------
    runs : iterable
        Correct runs: ``(actual, expected, inputs)`` or ``(actual, expected, inputs, params)``
        tuples, or mappings with those keys.
    op : str
        The op (a name :func:`~tolstat.ops.registry.op_statistics` knows).
    dtype : str or dtype
        Output format.
    acc_dtype, stores : optional
        As in :func:`tolerance`.
    floor : float, default 1
        Least constant (``>= 0``).

    Returns
    -------
    FittedModel

    Raises
    ------
    ValueError
        No runs, or a run the model cannot describe (:func:`fit_scale`).
    """
    if isinstance(floor, bool) or not isinstance(floor, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(floor) and floor >= 0):
        raise ValueError(f"floor must be a finite number >= 0, got {floor!r}")
    stores = _stores(stores)
    dt = _dtype(dtype)
    acc = _acc_name(dt, acc_dtype)
    excess, sizes = [], []
    name = op
    for actual, expected, inputs, params in _run_items(runs):
        name, m, K = _statistics(op, dt, inputs, params)
        tol = _make(name, dt, acc, (m, K, stores), 0.5, 1.0, MODEL_LABEL)
        excess.append(tol.excess(actual, expected))
        sizes.append(max(int(m.size), 1))
    if not excess:
        raise ValueError("runs is empty: fit_tolerance needs at least one correct run (tolerance() needs none)")
    c = max(fit_scale(excess, sizes), float(floor))
    label = (f"{MODEL_LABEL}; constant c = {c:.3g} fitted on {len(excess)} runs (at least {float(floor):g}), "
             f"tail extrapolated below budget 1/{len(excess) + 1}")
    return FittedModel(op=name, dtype=dt, acc_dtype=acc, scale=c, n_runs=len(excess), label=label, stores=stores)
