"""Operator-aware rounding-noise model and whole-output statistics of one run.

A kernel output differs from its float64 reference by rounding noise whose size depends on
the operator, not only on the output value. Following the probabilistic rounding-error
analysis of Higham & Mary ("A New Approach to Probabilistic Rounding Error Analysis"), the
error of an inner product of length ``K`` computed in precision ``u_acc`` is of order
``sqrt(K) * u_acc * |x|^T |y|``: the covariate is the operator applied to the *absolute*
inputs (``|A| |B|`` for a matrix product), not the absolute output, because cancellation
makes ``|ref|`` arbitrarily small while the noise stays. Storing the result in the output
format adds at most half an ULP, ``u_out * |ref|``.

This module turns that into one per-element **noise scale**

.. math::

    s_i = c_{out} u_{out} |ref_i| + c_{acc} u_{acc} \\sqrt{K} m_i
          + c_{mid} u_{out} m_i / \\sqrt{K} + u_{out} \\, tiny_{out}

and reduces the **normalised error** ``z_i = d_i / s_i`` (``d = actual - expected`` in
float64) of one run to a handful of statistics (:func:`run_statistics`): the maximum, the
RMS, the mean, a normalised signed mean, the fraction beyond ``k``, per-row versions for
row-wise operators and operator invariants (:func:`tolstat.measure.invariants.register_invariant`). The statistics
are in units of expected rounding noise, so they are comparable across operators and
dtypes; no constant is fitted here (a global factor is absorbed by whatever threshold is
calibrated on them).

Half-ULP property
-----------------
With ``c_out >= 1``, a *correctly rounded* output (the reference rounded once to the
output format, round to nearest) has ``|z_i| <= 1`` for every element whose reference
lies within the format's finite range. Proof: let ``p`` be the precision of the format
(``u_out = 2**-p``) and ``tiny`` its smallest positive normal.

* If ``2**e <= |ref_i| < 2**(e+1)`` with ``2**e >= tiny``, the format's numbers around
  ``ref_i`` are spaced ``2**(e-p+1) = 2 u_out 2**e`` apart on ``[2**e, 2**(e+1)]``, so
  rounding to nearest moves ``ref_i`` by at most ``u_out 2**e <= u_out |ref_i|``. (A value
  just below ``2**e`` that rounds up to ``2**e`` is covered by the binade below, whose
  bound ``u_out 2**(e-1)`` is smaller still; a value above the largest finite number
  that rounds down to it is covered by the top binade.)
* If ``|ref_i| < tiny`` (subnormal range, gradual underflow), the spacing is the smallest
  subnormal ``2 u_out tiny``, so the move is at most ``u_out tiny``, the floor term.

In both cases ``|d_i| <= u_out max(|ref_i|, tiny) <= s_i`` since every other term of
``s_i`` is nonnegative. In floating point the bound survives: ``u_out |ref_i|`` and
``u_out tiny`` are exact (power-of-two scaling), adding nonnegative terms can only
round up to a value ``>=`` the larger term, the subtraction ``actual - ref`` and the
division are monotone roundings, so the computed ``|d_i| / s_i`` is ``<= 1``.
References outside the finite range (which round to infinity) and non-finite outputs
make the statistics ``+inf``.

Examples
--------
>>> import numpy as np
>>> from tolstat.measure.noise import run_statistics
>>> ref = np.linspace(-3, 3, 101)
>>> out = ref.astype(np.float16)            # correctly rounded
>>> st = run_statistics(out, ref, dtype="float16")
>>> st["op_max"] <= 1.0
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from tolstat.measure.invariants import _proj_stat, _rows, invariant_values, invariants
from tolstat._base.dtypes import target_dtype, unit_roundoff

__all__ = [
    "FRAC_K",
    "STATISTICS",
    "noise_scale",
    "record_statistic_names",
    "record_statistics",
    "run_statistics",
    "NoiseShape",
    "PLAIN_SHAPE",
    "MID_SHAPE",
    "score_statistic_names",
    "statistic_names",
    "BIAS_STATISTICS",
    "ROW_MAXIMA",
    "ROW_TAIL",
    "beyond_calibration",
    "size_limits",
    "output_rows",
    "row_extrapolation",
    "maxima_extrapolation",
    "bias_extrapolation",
    "extrapolated_rows",
]


#: default ``k`` of ``op_frac`` (fraction of elements with ``|z_i| > k``)
FRAC_K = 1.0


@dataclass(frozen=True)
class NoiseShape:
    """The constants of the operator noise model and of its statistics.

    Attributes
    ----------
    c_out, c_acc : float, default 1
        Weights of the output-rounding and accumulation terms of :func:`noise_scale`.
        The half-ULP property needs ``c_out >= 1``.
    c_mid : float, default 0
        Weight of the optional intermediate-store term ``c_mid * u_out * m_i / sqrt(K)``:
        one rounding to the *output* format of an intermediate value of the size of a
        typical partial sum (kernels that store partial results in the output format:
        split-K with atomic adds, attention probabilities cast to the output format for
        the second product, scans that store block totals). ``MID_SHAPE`` has ``c_mid = 1``.
    frac_k : float, default ``FRAC_K``
        Threshold of ``op_frac`` (the fraction of elements with ``|z_i| > frac_k``).
    """

    c_out: float = 1.0
    c_acc: float = 1.0
    c_mid: float = 0.0
    frac_k: float = FRAC_K

    def __post_init__(self) -> None:
        for name in ("c_out", "c_acc", "c_mid", "frac_k"):
            object.__setattr__(self, name, _check_pos(f"NoiseShape.{name}", getattr(self, name)))


def _shape(shape: "NoiseShape | None") -> "NoiseShape":
    if shape is None:
        return PLAIN_SHAPE
    if not isinstance(shape, NoiseShape):
        raise TypeError(f"shape must be a NoiseShape, got {type(shape).__name__}")
    return shape

#: per-run statistics produced by :func:`run_statistics`: name -> description
STATISTICS: dict[str, str] = {
    "op_max": "max |z_i|, z_i = d_i / s_i (operator noise model)",
    "op_rms": "sqrt(mean z_i^2)",
    "op_mean": "mean |z_i|",
    "op_bias": "|mean x_i| * sqrt(n), x_i = (actual_i - RN(ref_i)) / s_i: normalised signed mean of the "
               "error beyond the correctly rounded reference",
    "op_sbias": "|mean sign(ref_i) x_i| * sqrt(n): normalised mean toward or away from zero (x as op_bias)",
    "op_frac": "fraction of elements with |z_i| > k (k = FRAC_K unless given)",
    "op_row_rms_max": "largest RMS of z over a row (row-wise ops; NaN otherwise)",
    "op_row_rms_mean": "mean over rows of the row RMS of z (row-wise ops; NaN otherwise)",
    "op_row_bias_max": "largest |sum_j (actual_j - RN(ref_j))| / sqrt(sum_j s_j^2) over rows (row-wise ops)",
}


def _f64(x: Any, name: str) -> np.ndarray:
    from tolstat.measure.metrics import as_array

    a = as_array(x, name=name)
    if a.dtype.kind in "bOSUM":
        raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.float64)


def _float_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a numpy array of its own float dtype (no copy), or the error of :func:`_f64`."""
    from tolstat.measure.metrics import as_array

    a = as_array(x, name=name)
    if a.dtype.kind in "bOSUM":
        raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
    return a if a.dtype.kind == "f" or a.dtype.kind == "V" else np.asarray(a, dtype=np.float64)


def _check_pos(name: str, v: float) -> float:
    if not (isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


#: the plain operator model and the model with the intermediate-store term
PLAIN_SHAPE = NoiseShape()
MID_SHAPE = NoiseShape(c_mid=1.0)


def noise_scale(
    expected: Any,
    *,
    dtype: Any,
    magnitude: Any = None,
    K: float = 1.0,
    acc_dtype: Any = "float32",
    shape: NoiseShape | None = None,
) -> np.ndarray:
    """Per-element noise scale ``s_i`` of the operator model (module docstring).

    Parameters
    ----------
    expected : array_like
        The float64 reference.
    dtype : str or dtype
        Output format of the kernel (``u_out`` and ``tiny_out``).
    magnitude : array_like, optional
        ``m_i``: the operator applied to the absolute inputs, broadcastable to
        ``expected``. Default ``|expected|`` (no cancellation information).
    K : float, default 1
        Reduction length (1 for pointwise ops).
    acc_dtype : str or dtype, default "float32"
        Accumulation format (``u_acc``).
    shape : NoiseShape, optional
        The weights ``c_out``, ``c_acc`` and ``c_mid`` of the terms (default
        ``NoiseShape()``: 1, 1 and 0).

    Returns
    -------
    numpy.ndarray
        float64 array of ``expected``'s shape, every entry ``> 0`` where finite.
    """
    ref = _f64(expected, "expected")
    td = target_dtype(dtype)
    u_out = unit_roundoff(td.name)
    u_acc = unit_roundoff(acc_dtype)
    K = _check_pos("K", K)
    sh = _shape(shape)
    c_out, c_acc, c_mid = sh.c_out, sh.c_acc, sh.c_mid
    aref = np.abs(ref)
    if magnitude is None:
        m = aref
    else:
        m = np.abs(_f64(magnitude, "magnitude"))
        try:
            m = np.broadcast_to(m, ref.shape)
        except ValueError as exc:
            raise ValueError(
                f"magnitude of shape {m.shape} does not broadcast to expected's shape {ref.shape}"
            ) from exc
    with np.errstate(invalid="ignore", over="ignore"):
        s = (c_out * u_out) * aref
        s += (c_acc * u_acc * math.sqrt(K)) * m
        if c_mid:
            s += (c_mid * u_out / math.sqrt(max(K, 1.0))) * m
        s += u_out * td.tiny
    return s


def statistic_names(op: str | None = None) -> list[str]:
    """Names of the statistics :func:`run_statistics` returns for ``op``."""
    return list(STATISTICS) + [f"inv_{k}" for k in invariants(op)]


# ----------------------------------------------------------------------- statistics
def run_statistics(
    actual: Any,
    expected: Any,
    *,
    dtype: Any,
    magnitude: Any = None,
    K: float = 1.0,
    acc_dtype: Any = "float32",
    row_axis: int = -1,
    rowwise: bool = False,
    op: str | None = None,
    shape: NoiseShape | None = None,
) -> dict[str, float]:
    """Whole-output statistics of the normalised error of one run.

    ``z_i = d_i / s_i`` with ``d = actual - expected`` (float64) and ``s`` from
    :func:`noise_scale`. The same function is meant for building the error dataset and
    for checking a run, so a threshold calibrated on these values applies to a check.

    Parameters
    ----------
    actual, expected : array_like
        Kernel output (any float dtype, torch tensors accepted) and float64 reference of
        the same shape.
    dtype : str or dtype
        Output format.
    magnitude, K, acc_dtype
        See :func:`noise_scale`.
    row_axis : int, default -1
        Axis along which a row runs (row-wise ops).
    rowwise : bool, default False
        Compute the per-row statistics (``op_row_*``); NaN otherwise.
    op : str, optional
        Operator name: its registered invariants (:func:`~tolstat.measure.invariants.register_invariant`) are added
        as ``inv_<name>``.
    shape : NoiseShape, optional
        The weights of :func:`noise_scale`'s terms and the threshold ``frac_k`` of
        ``op_frac`` (default ``NoiseShape()``).

    Returns
    -------
    dict of str to float
        The statistics of ``STATISTICS`` (and ``inv_*``): ``+inf`` everywhere when an
        output element is non-finite where its reference is finite (or differs from a
        non-finite reference), NaN for a statistic that does not apply (row statistics
        of a non-row-wise op). Empty outputs give 0.

    Raises
    ------
    ValueError
        Shapes differ, a bad ``row_axis`` or a negative parameter.
    """
    a = _f64(actual, "actual")
    e = _f64(expected, "expected")
    if a.shape != e.shape:
        raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}")
    sh = _shape(shape)
    frac_k = sh.frac_k
    if rowwise and a.ndim and (not isinstance(row_axis, (int, np.integer))
                               or not -a.ndim <= row_axis < a.ndim):
        raise ValueError(f"row_axis {row_axis!r} is not an axis of a {a.ndim}-d output")
    s = noise_scale(e, dtype=dtype, magnitude=magnitude, K=K, acc_dtype=acc_dtype, shape=sh)
    names = statistic_names(op)
    inv = invariants(op)
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore", over="ignore"):
        d = a - e
    finite = np.isfinite(d) & np.isfinite(s)
    if not finite.all():
        # non-finite: matched non-finite references are exact, anything else fails
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        bad = ~finite & ~same
        if bad.any():
            return {k: math.inf for k in names}
        d = np.where(finite, d, 0.0)
        s = np.where(finite, s, 1.0)
    n = d.size
    if n == 0:
        return {k: (0.0 if not k.startswith("op_row") or rowwise else math.nan) for k in names}
    z = d / s
    az = np.abs(z)
    z2 = z * z
    out["op_max"] = float(az.max())
    out["op_rms"] = float(math.sqrt(z2.mean()))
    out["op_mean"] = float(az.mean())
    db = excess_error(a, e, dtype, finite)
    zb = db / s
    out["op_bias"] = float(abs(zb.mean()) * math.sqrt(n))
    sg = np.sign(np.where(finite, e, 0.0))  # a matched non-finite pair counts as exact (z = 0)
    out["op_sbias"] = float(abs((sg * zb).mean()) * math.sqrt(n))
    out["op_frac"] = float(np.count_nonzero(az > frac_k) / n)
    if rowwise and a.ndim:
        zr = np.moveaxis(z2, row_axis, -1)
        row_ms = _rows(zr).mean(-1)
        out["op_row_rms_max"] = float(math.sqrt(row_ms.max()))
        out["op_row_rms_mean"] = float(np.sqrt(row_ms).mean())
        out["op_row_bias_max"] = _proj_stat(np.moveaxis(db, row_axis, -1),
                                            np.moveaxis(s, row_axis, -1))
    else:
        out["op_row_rms_max"] = out["op_row_rms_mean"] = out["op_row_bias_max"] = math.nan
    if inv:
        out.update(invariant_values(a, e, s, finite, row_axis, inv, op))
    return out


def excess_error(actual: np.ndarray, expected: np.ndarray, dtype: Any, finite: np.ndarray | None = None) -> np.ndarray:
    """``actual - RN(expected)``: the error beyond the correctly rounded reference.

    ``RN`` rounds the float64 reference to the output format (round to nearest even), so a
    correctly rounded output has excess 0 everywhere. The bias statistics use it: the
    rounding errors of a correctly rounded output are not mean-zero on structured inputs
    (values on a grid, one sign), and their signed mean grows like ``sqrt(n)`` without
    being a bug. A reference beyond the format's range is kept as it is; the excess is 0
    where ``finite`` (default: both arrays finite) is False.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        db = actual - rounded_reference(expected, dtype)
    ok = np.isfinite(db) if finite is None else finite & np.isfinite(db)
    return np.where(ok, db, 0.0)


def rounded_reference(expected: np.ndarray, dtype: Any) -> np.ndarray:
    """The float64 reference rounded to the output format (to nearest even), as float64;
    the reference itself where the rounded value is not finite (beyond the range)."""
    td = target_dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        r = expected.astype(td.np_dtype).astype(np.float64)
    return np.where(np.isfinite(r), r, expected)


#: suffix of the statistics computed with the intermediate-store term (``c_mid = 1``)
MID_SUFFIX = "_mid"
#: statistics (before the ``_mid`` copies and the ``inv_*``) that enter the recommended
#: combined score ``S = max_j T_j / q_j`` (measured in ``benchmarks/opstat_recall.py``)
SCORE_CORE = ("op_max", "op_rms", "op_row_rms_max", "op_bias", "op_sbias", "op_row_bias_max")


def record_statistics(
    actual: Any,
    expected: Any,
    *,
    dtype: Any,
    magnitude: Any = None,
    K: float = 1.0,
    acc_dtype: Any = "float32",
    row_axis: int = -1,
    rowwise: bool = False,
    op: str | None = None,
) -> dict[str, float]:
    """The per-run statistics an error dataset stores and a check recomputes.

    :func:`run_statistics` under two noise shapes: the plain operator model
    (``c_mid = 0``, names as in ``STATISTICS``) and the model with the
    intermediate-store term (``c_mid = 1``, the same names with ``MID_SUFFIX``). Kernels
    that store partial results in the output format (split-K atomics, attention
    probabilities cast for the second product, scans storing block totals) are in the
    second shape's units; kernels that do not are sharper in the first. On the embedded
    corpus the combined score over both shapes caught more bugs than either alone at the
    same false-positive rate (``docs/noise.md``).

    Parameters
    ----------
    actual, expected, dtype, magnitude, K, acc_dtype, row_axis, rowwise, op
        As in :func:`run_statistics`.

    Returns
    -------
    dict of str to float
        ``record_statistic_names(op)`` -> value.
    """
    kw: dict[str, Any] = {"dtype": dtype, "magnitude": magnitude, "K": K,
                          "acc_dtype": acc_dtype, "row_axis": row_axis, "rowwise": rowwise,
                          "op": op}
    fast = _record_fused(actual, expected, **kw)
    if fast is not None:
        return fast
    out = run_statistics(actual, expected, **kw)
    mid = run_statistics(actual, expected, shape=MID_SHAPE, **kw)
    out.update({k + MID_SUFFIX: v for k, v in mid.items()})
    return out


def _record_fused(actual: Any, expected: Any, *, dtype: Any, magnitude: Any, K: float, acc_dtype: Any,
                  row_axis: int, rowwise: bool, op: str | None) -> dict[str, float] | None:
    """:func:`record_statistics` with both noise shapes in one numba pass
    (:func:`tolstat.measure.fused.op_statistics`); None where :func:`run_statistics` must run
    (bad arguments, whose errors it raises, or an empty output). Equal to it up to the
    rounding of the sums (sequential here, pairwise in numpy); maxima and counts exact."""
    from tolstat.measure.fused import op_statistics

    try:
        a = _float_array(actual, "actual")
        e = _f64(expected, "expected")
        if a.shape != e.shape or a.size == 0:
            return None
        td = target_dtype(dtype)
        coef = op_pass_coefficients(td, _check_pos("K", K), acc_dtype)
        m = None
        if magnitude is not None:
            m = np.broadcast_to(_f64(magnitude, "magnitude"), e.shape)
        rows = bool(rowwise and a.ndim)
        if rows and (not isinstance(row_axis, (int, np.integer)) or not -a.ndim <= row_axis < a.ndim):
            return None
    except (ValueError, TypeError):
        return None
    moved = [np.moveaxis(x, row_axis, -1) if rows else x for x in (a, e, m) if x is not None]
    res = op_statistics(moved[0], moved[1], moved[2] if m is not None else None,
                        coef=coef, frac_k=PLAIN_SHAPE.frac_k, rowlen=a.shape[row_axis] if rows else None, dtype=td.name)
    return statistics_of_pass(res, a, e, magnitude, dtype=dtype, K=K, acc_dtype=acc_dtype, row_axis=row_axis,
                              rows=rows, op=op)


def op_pass_coefficients(td: Any, K: float, acc_dtype: Any = "float32") -> tuple[float, float, float, float]:
    """``(A, B, C, D)`` of the one-pass operator statistics (:func:`tolstat.measure.fused.op_statistics`):
    ``s0 = (A |e| + B m) + D`` is :func:`noise_scale` under ``PLAIN_SHAPE``, ``s1 = ((A |e| + B m) +
    C m) + D`` under ``MID_SHAPE``, for the output format ``td`` (a :class:`TargetDtype`) and
    the reduction length ``K``."""
    try:
        return _pass_coefficients(td, float(K), acc_dtype)
    except TypeError:  # an unhashable acc_dtype: worked out without the cache
        return _pass_coefficients.__wrapped__(td, float(K), acc_dtype)


@functools.lru_cache(maxsize=256)
def _pass_coefficients(td: Any, K: float, acc_dtype: Any) -> tuple[float, float, float, float]:
    """:func:`op_pass_coefficients`, cached (a suite checks few formats and lengths)."""
    u_out, u_acc = unit_roundoff(td.name), unit_roundoff(acc_dtype)
    return (PLAIN_SHAPE.c_out * u_out, PLAIN_SHAPE.c_acc * u_acc * math.sqrt(K),
            MID_SHAPE.c_mid * u_out / math.sqrt(max(K, 1.0)), u_out * td.tiny)


class PassWithInvariants(NamedTuple):
    """A pass's sums (``stats`` and ``bad`` of :class:`tolstat.measure.fused.OpPass`) with
    ``invariants``, which returns :func:`pass_invariants` of the same pair and arguments,
    computed elsewhere (a check computes them on a second core during its pass):
    :func:`statistics_of_pass` reads it where it would compute them."""

    stats: np.ndarray
    bad: np.ndarray
    invariants: Callable[[], Any]


def statistics_of_pass(res: Any, actual: np.ndarray, expected: np.ndarray, magnitude: Any, *, dtype: Any,
                       K: float, acc_dtype: Any, row_axis: int, rows: bool, op: str | None) -> dict[str, float]:
    """The statistics of :func:`record_statistics` from the sums of one
    :func:`tolstat.measure.fused.op_statistics` pass (``res``) of the pair; the op's
    invariants (:func:`tolstat.measure.invariants.invariant_values`) are computed here,
    or read from a :class:`PassWithInvariants` ``res``."""
    st, bad = res.stats, res.bad
    fused_invariants = res.invariants if type(res) is PassWithInvariants else None
    a, e = actual, expected
    inv = invariants(op)
    names_of = _suffixed_names(tuple(inv))
    n = a.size
    out: dict[str, float] = {}
    scales = None  # the invariants' scales of both shapes, made when a shape first needs them
    fused = None
    if inv and not (bad[0] and bad[1]):
        fused = fused_invariants() if fused_invariants is not None else _fused_invariants(
            a, e, magnitude, inv, dtype=dtype, K=K, acc_dtype=acc_dtype, row_axis=row_axis, op=op)
    for j in (0, 1):
        names = names_of[j]  # (name, its name under this shape)
        if bad[j]:
            out.update({nm: math.inf for _, nm in names})
            continue
        mx, s2, sa, sz, cnt, rms_max, rms_sum, bias_max, ssz = st[j].tolist()  # Python floats
        vals = {"op_max": mx, "op_rms": math.sqrt(s2 / n), "op_mean": sa / n,
                "op_bias": abs(sz / n) * math.sqrt(n), "op_sbias": abs(ssz / n) * math.sqrt(n),
                "op_frac": cnt / n}
        if rows:
            vals.update(op_row_rms_max=math.sqrt(rms_max), op_row_rms_mean=rms_sum / (n // a.shape[row_axis]),
                        op_row_bias_max=bias_max)
        else:
            vals.update(op_row_rms_max=math.nan, op_row_rms_mean=math.nan, op_row_bias_max=math.nan)
        if fused is not None:
            vals.update(fused[j])
        elif inv:
            if scales is None:
                scales = _invariant_scales(a, e, magnitude, dtype=dtype, K=K, acc_dtype=acc_dtype)
            a64, s, finite = scales[j]
            vals.update(invariant_values(a64, e, s, finite, row_axis, inv, op))
        out.update({nm: vals[k] for k, nm in names})
    return out


def pass_invariants(actual: np.ndarray, expected: np.ndarray, magnitude: Any, *, dtype: Any, K: float,
                    acc_dtype: Any, row_axis: int, op: str | None) -> tuple[dict[str, float], dict[str, float]] | None:
    """The invariant values :func:`statistics_of_pass` computes for a pair by the one-pass
    kernels (both noise shapes), or None where it computes them otherwise (or the op has
    none). Their errors are its errors."""
    inv = invariants(op)
    if not inv:
        return None
    return _fused_invariants(actual, expected, magnitude, inv, dtype=dtype, K=K, acc_dtype=acc_dtype,
                             row_axis=row_axis, op=op)


@functools.lru_cache(maxsize=64)
def _suffixed_names(inv_names: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Per noise shape (plain, intermediate-store), the pairs ``(name, name with the shape's
    suffix)`` of :func:`statistic_names` for an op with the invariants ``inv_names``."""
    names = list(STATISTICS) + [f"inv_{k}" for k in inv_names]
    return tuple(tuple((nm, nm + suffix) for nm in names) for suffix in ("", MID_SUFFIX))


@functools.lru_cache(maxsize=1)
def _fused_invariant_kinds() -> dict[Any, Any]:
    """The built-in invariants with a kernel (:mod:`tolstat.measure.invariant_kernels`):
    function -> projection weight, or None for the masked-zero count."""
    from tolstat.measure import invariant_kernels as K_
    from tolstat.measure import invariants as I_

    return {I_._inv_softmax_row_sum: K_.W_DIFF, I_._inv_masked_zero: None, I_._inv_log_softmax_lse: K_.W_EXP_REF,
            I_._inv_row_mean: K_.W_DIFF, I_._inv_row_scale_centred: K_.W_REF_CENTRED, I_._inv_row_scale: K_.W_REF}


def _invariant_layout(inv: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, Any]]] | None:
    """How :func:`_fused_invariants` computes ``inv``: the masked-zero counts and the
    projections with their kernel weight (one pass per projection; the first also counts
    the zeros, an op with the count alone runs one pass for it); None where an invariant
    has no kernel. Cached by the invariant functions (a suite checks few ops)."""
    key = tuple(inv.items())
    got = _LAYOUTS.get(key)
    if got is None:
        kinds = _fused_invariant_kinds()
        if not all(fn in kinds for fn in inv.values()):
            got = None
        else:
            zeros = [name for name, fn in inv.items() if kinds[fn] is None]
            projections = [(name, kinds[fn]) for name, fn in inv.items() if kinds[fn] is not None]
            got = (zeros, projections)
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        _LAYOUTS[key] = got
    return got


_LAYOUTS: dict[tuple[tuple[str, Any], ...], Any] = {}


def _fused_invariants(actual: np.ndarray, expected: np.ndarray, magnitude: Any, inv: Mapping[str, Any], *,
                      dtype: Any, K: float, acc_dtype: Any, row_axis: int,
                      op: str | None) -> tuple[dict[str, float], dict[str, float]] | None:
    """The ``inv_<name>`` values of both noise shapes (plain, intermediate-store) by the
    kernels of :mod:`tolstat.measure.invariant_kernels`, one pass per invariant over the
    pair and the magnitude; None where :func:`_invariant_scales` and
    :func:`~tolstat.measure.invariants.invariant_values` must run (an invariant registered
    by the user, a magnitude that does not have the output's shape, noise shapes that
    differ otherwise than by the intermediate-store term). The same values up to the
    rounding of the row sums (reassociated here, pairwise in numpy)."""
    layout = _invariant_layout(inv)
    if layout is None:
        return None
    from tolstat.measure import invariant_kernels as K_
    from tolstat.measure.fused import decode16_params

    a = np.asarray(actual)
    # a 16-bit float output is read as its bit patterns and decoded in the kernel (no widened copy)
    d16 = decode16_params(a.dtype)
    if not d16[0]:
        a = np.asarray(a, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    kin = _shape_coefficients(a, e, magnitude, dtype=dtype, K=K, acc_dtype=acc_dtype)
    if kin is None:
        return None

    m, plain, mid = kin
    last = not e.ndim or row_axis in (-1, e.ndim - 1)

    def rows_last(x: np.ndarray) -> np.ndarray:
        if not x.ndim:
            return x.reshape(1)
        return np.ascontiguousarray(x if last else np.moveaxis(x, row_axis, -1)).reshape(-1)

    af, ef = rows_last(a), rows_last(e)
    if d16[0]:
        af = af.view(np.uint16)
    mf = ef if m is None else rows_last(m if m.shape == e.shape else np.broadcast_to(m, e.shape))
    rowlen = int(a.shape[row_axis]) if a.ndim else 1
    zeros, projections = layout
    values: dict[str, list[float]] = {}
    coefs = (plain, mid)
    count = bool(zeros)
    for name, kind in projections or [(zeros[0], None)]:
        got = np.zeros(4)
        if ef.size and rowlen:
            K_.row_projections(af, ef, mf, m is not None, coefs, rowlen, K_.W_DIFF if kind is None else kind,
                               count, got, d16)
        g = got.tolist()
        if count:
            for z in zeros:
                values[z] = g[2:]
            count = False
        if kind is not None:
            values[name] = g[:2]
    out: tuple[dict[str, float], dict[str, float]] = ({}, {})
    for name in inv:  # in the order of the op's invariants
        v0, v1 = values[name]
        if not (v0 >= 0 and v1 >= 0):  # NaN: as invariant_values reports it
            raise ValueError(f"invariant {name!r} of op {op!r} returned {v0 if not v0 >= 0 else v1!r}; it must be >= 0")
        out[0]["inv_" + name] = v0
        out[1]["inv_" + name] = v1
    return out


#: the two noise shapes differ only by the intermediate-store term (what the one-pass kernels assume)
_SHAPES_DIFFER_BY_MID = (MID_SHAPE.c_out == PLAIN_SHAPE.c_out and MID_SHAPE.c_acc == PLAIN_SHAPE.c_acc
                         and not PLAIN_SHAPE.c_mid)


def _shape_coefficients(a: np.ndarray, e: np.ndarray, magnitude: Any, *, dtype: Any, K: float,
                        acc_dtype: Any) -> tuple[np.ndarray | None, tuple, tuple] | None:
    """What the one-pass kernels of both noise shapes read: the magnitude as float64 (None
    without one) and the plain and intermediate-store coefficients ``(A, B, C, D)``; None
    where they do not apply (the shapes differ otherwise than by the intermediate-store
    term, a magnitude that does not broadcast to ``e``'s shape, ``a`` of another shape)."""
    if type(magnitude) is np.ndarray and magnitude.dtype == np.float64 and magnitude.shape == e.shape:
        m = magnitude  # the check's and the record's case: what _f64 returns for it, without its tests
    else:
        m = None if magnitude is None else _f64(magnitude, "magnitude")
        try:
            fits = m is None or m.shape == e.shape or np.broadcast_shapes(m.shape, e.shape) == e.shape
        except ValueError:  # noise_scale raises its own error
            fits = False
        if not fits:
            return None
    if not (_SHAPES_DIFFER_BY_MID and a.shape == e.shape):
        return None
    A, B, C, D = op_pass_coefficients(target_dtype(dtype), _check_pos("K", K), acc_dtype)
    return m, (A, B, 0.0, D), (A, B, C, D)  # the plain shape has no intermediate-store term


def _invariant_scales(actual: np.ndarray, expected: np.ndarray, magnitude: Any, *, dtype: Any, K: float,
                      acc_dtype: Any) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per noise shape (plain, then intermediate-store), what the invariants read:
    ``(actual as float64, s, finite)`` with ``s`` the :func:`noise_scale` of that shape, 1.0
    where ``finite = isfinite(actual - expected) & isfinite(s)`` is False.

    Both shapes in one numba pass (:func:`tolstat.measure.scale_kernels.invariant_scales`:
    the operations of :func:`noise_scale`, in its order) where the two shapes differ only by
    the intermediate-store term and the arrays are float64 of one shape (magnitudes
    broadcast to it); :func:`noise_scale` per shape otherwise."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    kin = _shape_coefficients(a, e, magnitude, dtype=dtype, K=K, acc_dtype=acc_dtype)
    if kin is not None:
        from tolstat.measure.scale_kernels import invariant_scales

        m, *coefs = kin
        af, ef = np.ascontiguousarray(a).ravel(), np.ascontiguousarray(e).ravel()
        mf = ef if m is None else np.ascontiguousarray(np.broadcast_to(m, e.shape)).ravel()
        s0, s1 = np.empty(e.size), np.empty(e.size)
        ok0, ok1 = np.empty(e.size, dtype=bool), np.empty(e.size, dtype=bool)
        invariant_scales(af, ef, mf, m is not None, coefs[0], coefs[1], s0, s1, ok0, ok1)
        return [(a, s0.reshape(e.shape), ok0.reshape(e.shape)), (a, s1.reshape(e.shape), ok1.reshape(e.shape))]
    out = []
    for sh in (PLAIN_SHAPE, MID_SHAPE):
        s = noise_scale(e, dtype=dtype, magnitude=magnitude, K=K, acc_dtype=acc_dtype, shape=sh)
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(a - e) & np.isfinite(s)
        if not finite.all():
            s = np.where(finite, s, 1.0)
        out.append((a, s, finite))
    return out


def record_statistic_names(op: str | None = None) -> list[str]:
    """Names of the statistics :func:`record_statistics` returns for ``op``."""
    base = statistic_names(op)
    return base + [k + MID_SUFFIX for k in base]


def score_statistic_names(op: str | None = None) -> list[str]:
    """The recommended members of the combined score for ``op`` (both noise shapes).

    ``SCORE_CORE`` plus the op's invariants, each under both noise shapes. Statistics
    that are NaN for a run (row statistics of a non-row-wise op) should be skipped.
    """
    base = list(SCORE_CORE) + [f"inv_{k}" for k in invariants(op)]
    return base + [k + MID_SUFFIX for k in base]


# ----------------------------------------------------- row maxima beyond the calibrated rows
#: the tail probability at which :func:`row_extrapolation` matches the largest of more
#: normal row sums to the largest of fewer
ROW_TAIL = 0.01

#: the statistics that are the largest over an output's rows of a normalised row sum, each
#: under both noise shapes: the built-in row invariants (not ``inv_masked_zero``, a count)
#: and the row bias; what :func:`row_extrapolation` divides
ROW_MAXIMA = frozenset(n + sfx for n in ("inv_row_sum", "inv_row_lse", "inv_row_mean", "inv_row_scale",
                                         "op_row_bias_max") for sfx in ("", MID_SUFFIX))


def output_rows(shape: Any) -> int:
    """The rows of an output of ``shape`` over which the row maxima (:data:`ROW_MAXIMA`)
    are taken: its elements divided by its last dimension (1 for a scalar or an empty output)."""
    shape = tuple(int(s) for s in shape)
    if not shape or not shape[-1]:
        return 1
    return max(1, math.prod(shape) // shape[-1])


def maxima_extrapolation(count: Any, count_max: float, *, name: str = "count_max") -> Any:
    """What a statistic that is the largest of ``count`` values close to normal is divided
    by, for a table calibrated on at most ``count_max`` of them: 1 where ``count <=
    count_max``, else ``z(p / (2 count)) / z(p / (2 count_max))`` with ``z`` the normal
    upper quantile and ``p =`` :data:`ROW_TAIL`.

    For ``count`` independent normal values the level-``p`` quantile of the largest
    absolute value is about ``sigma z(p / (2 count))``, so the factor carries a threshold
    set on ``count_max`` values to ``count`` values whatever ``sigma`` is. Model-based: it
    assumes independent, normal values (for lighter tails, a bounded rounding error, it
    carries more than needed). ``count`` may be an array; ``name`` names ``count_max`` in
    the error.
    """
    rmax = float(count_max)
    if not (rmax >= 1):
        raise ValueError(f"{name} must be >= 1, got {count_max!r}")
    if isinstance(count, _SCALARS):  # one check: the same numbers without arrays
        return _maxima_factor(float(count), rmax) if float(count) > rmax else 1.0
    from scipy.special import ndtri  # the normal quantile, a ufunc

    r = np.asarray(count, dtype=np.float64)
    beyond = r > rmax
    if not beyond.any():
        return np.ones_like(r) if r.ndim else 1.0
    f = np.where(beyond, ndtri(ROW_TAIL / (2.0 * np.maximum(r, rmax))) / ndtri(ROW_TAIL / (2.0 * rmax)), 1.0)
    return f if r.ndim else float(f)


#: the numbers a single check passes as a count of elements or rows
_SCALARS = (int, float, np.integer, np.floating)


@functools.lru_cache(maxsize=1024)
def _maxima_factor(count: float, count_max: float) -> float:
    """:func:`maxima_extrapolation` of one ``count > count_max`` (a suite checks few sizes)."""
    from scipy.special import ndtri

    return float(ndtri(ROW_TAIL / (2.0 * count)) / ndtri(ROW_TAIL / (2.0 * count_max)))


def row_extrapolation(rows: Any, rows_max: float) -> Any:
    """What a check of an output with ``rows`` rows divides its row maxima
    (:data:`ROW_MAXIMA`) by, for a table whose calibration runs had at most ``rows_max``
    rows: :func:`maxima_extrapolation` over rows, 1 where ``rows <= rows_max``, else
    ``z(p / (2 rows)) / z(p / (2 rows_max))``.

    A row invariant or the row bias is the largest over the rows of ``|t_r|``, a normalised
    row sum that is close to normal; the largest of more rows is larger (a table calibrated
    on 4 rows of 1,024 failed 55 % of correct softmax outputs of 256 rows,
    ``benchmarks/size_transfer.py``). Model-based: it assumes independent, normal row
    sums; outputs within the calibrated rows are unchanged. ``rows`` may be an array.
    """
    return maxima_extrapolation(rows, rows_max, name="rows_max")


def extrapolated_rows(stats: Mapping[str, Any], factor: Any) -> dict[str, Any]:
    """``stats`` with every statistic of :data:`ROW_MAXIMA` divided by
    :func:`row_extrapolation`'s ``factor``; the other statistics as they are."""
    return {k: (v / factor if k in ROW_MAXIMA else v) for k, v in stats.items()}


#: the whole-output bias statistics (``|mean z| sqrt(n)``, both noise shapes), which
#: :func:`beyond_calibration` reads at the calibrated size
BIAS_STATISTICS = frozenset(n + sfx for n in ("op_bias", "op_sbias") for sfx in ("", MID_SUFFIX))


def size_limits(certificate: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(rows_max, n_max)`` of an operator-form certificate as :func:`beyond_calibration`
    reads them: its ``rows_max`` where its score holds a row maximum (:data:`ROW_MAXIMA`),
    its ``n_elements_max`` where it holds the whole-output bias (:data:`BIAS_STATISTICS`);
    None where it holds neither or the table does not record it."""
    q = certificate.get("normalisers") or {}
    rows_max = certificate.get("rows_max") if any(k in ROW_MAXIMA for k in q) else None
    n_max = certificate.get("n_elements_max") if any(k in BIAS_STATISTICS for k in q) else None
    return rows_max, n_max


def beyond_calibration(stats: Mapping[str, Any], *, rows: Any, rows_max: float | None, n: Any,
                       n_max: float | None) -> dict[str, Any]:
    """The statistics of outputs beyond their table's calibrated size as a decision reads
    them: the one definition for a check and for the scoring of recorded runs.

    With ``rows > rows_max`` the row maxima (:data:`ROW_MAXIMA`) are divided by
    :func:`row_extrapolation`. With ``n > n_max`` elements the whole-output bias
    (:data:`BIAS_STATISTICS`, ``|mean z| sqrt(n)``) is read at the calibrated size,
    ``|mean z| sqrt(n_max)``: for an unbiased kernel it does not grow with ``n``, but a
    correct kernel whose rounding is slightly biased has it grow like ``sqrt(n)``, which
    no calibration run showed; beyond ``n_max`` the bias test keeps the power it had at
    ``n_max``. ``rows`` and ``n`` may be arrays (one per run); ``None`` limits (tables
    that do not record them) leave the statistics as they are.
    """
    out = dict(stats)
    if rows_max is not None:
        f = row_extrapolation(rows, rows_max)
        if np.any(f != 1.0):
            out = extrapolated_rows(out, f)
    if n_max is not None and float(n_max) >= 1:
        beyond = float(n) > n_max if isinstance(n, _SCALARS) else np.any(np.asarray(n, dtype=np.float64) > n_max)
        if beyond:
            g = bias_extrapolation(n, n_max)  # a float for one check, an array for runs
            out = {k: (v / g if k in BIAS_STATISTICS else v) for k, v in out.items()}
    return out


def bias_extrapolation(n: Any, n_max: float) -> Any:
    """What a bias of the form ``|mean| sqrt(n)`` over ``n`` elements is divided by to be
    read at the calibrated size ``n_max``: ``sqrt(n / n_max)``, 1 where ``n <= n_max``
    (the operator form's :data:`BIAS_STATISTICS` and the plain pairs' ``bias`` alike).
    ``n`` may be an array."""
    if isinstance(n, _SCALARS):  # one check: the same number without arrays
        return math.sqrt(max(float(n), float(n_max)) / float(n_max))
    nn = np.asarray(n, dtype=np.float64)
    return np.sqrt(np.maximum(nn, float(n_max)) / float(n_max))


# ----------------------------------------------------------------------- combined score
def score_of_pair(stats: Mapping[str, float], keys: Any, qs: Any) -> tuple[float, str]:
    """:func:`combined_score` of one pair (``stats`` Python floats, ``qs`` the normalisers of
    ``keys``, checked by the caller): ``(S, the statistic attaining it)``, ``(NaN, "")`` where
    every statistic is NaN. The loop :func:`combined_score` runs for one pair; a check calls
    it with its entry's normalisers worked out once."""
    best, name = -math.inf, ""
    for k, qk in zip(keys, qs):
        v = stats[k] / qk
        if v > best or (not name and v == best):  # NaN skipped; the first maximum, as argmax
            best, name = v, k
    return (best if name else math.nan), name


def combined_score(stats: Any, normalisers: Any, *, which: bool = False) -> Any:
    """Combined score ``S = max_j T_j / q_j``: the one definition, used to calibrate and to check.

    NaN statistics are skipped (``S`` is NaN when none applies), an infinite one gives
    ``+inf``; with ``which=True`` also the name of the statistic attaining the maximum.
    """
    if type(stats) is not dict and not isinstance(stats, Mapping):
        raise TypeError(f"stats must be a mapping statistic name -> values, got {type(stats).__name__}")
    if not normalisers:
        raise ValueError("normalisers is empty")
    missing = [k for k in normalisers if k not in stats]
    if missing:
        raise ValueError(f"stats lacks the normalised statistics {missing}")
    keys = list(normalisers)
    qs = [float(normalisers[k]) for k in keys]
    if not all(math.isfinite(v) and v > 0 for v in qs):
        raise ValueError(f"normalisers must be finite and > 0, got {dict(normalisers)}")
    if all(type(stats[k]) is float for k in keys):  # one pair (a check): the same maximum, without arrays
        best, name = score_of_pair(stats, keys, qs)
        s0 = np.asarray(best, dtype=np.float64)  # 0-d, as the array path's
        return (s0, np.asarray(name, dtype=object)) if which else s0
    q = np.array(qs)
    cols = np.broadcast_arrays(*[np.asarray(stats[k], dtype=np.float64) for k in keys])
    shape = cols[0].shape
    m = np.stack([c.ravel() for c in cols], axis=1) / q
    allnan = np.isnan(m).all(axis=1)
    filled = np.where(np.isnan(m), -np.inf, m)
    idx = np.argmax(filled, axis=1)
    s = filled[np.arange(m.shape[0]), idx]
    s[allnan] = np.nan
    s = s.reshape(shape)
    if which:
        nm = np.asarray(keys, dtype=object)[idx]
        nm[allnan] = ""
        return s, nm.reshape(shape)
    return s
